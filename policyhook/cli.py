"""The `policyhook` command line.

Exit codes (every command): 0 success; 1 the policies or test cases found a problem (a load
error, a failed test, a changed decision with --fail-on-change); 2 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
STORE_ENV = "POLICYHOOK_STORE"


def _demo(args: argparse.Namespace) -> int:
    """Run the seed scenario; export OTLP when asked, or when the environment names an endpoint.

    The demo never needs a server: without the SDK, an endpoint from the environment is noted
    and ignored; only an explicit --otlp makes a missing SDK an error.
    """
    from policyhook.demo import run

    telemetry = None
    wanted = args.otlp if args.otlp is not None else bool(os.environ.get(OTLP_ENDPOINT_ENV))
    if wanted:
        from policyhook.otel import configure

        try:
            telemetry = configure(service_name="policyhook-demo")
        except ImportError as exc:
            if args.otlp:
                print(f"policyhook demo --otlp: {exc}", file=sys.stderr)
                return EXIT_USAGE
            print(f"policyhook demo: not exporting to ${OTLP_ENDPOINT_ENV}: {exc}", file=sys.stderr)
    guard = None
    if args.store:
        from policyhook.hook import Guard
        from policyhook.stores import open_store

        try:
            guard = Guard(store=open_store(args.store))
        except (ImportError, ValueError, ConnectionError) as exc:
            print(f"policyhook demo --store: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        run(sys.stdout, guard)
    finally:
        if telemetry is not None:
            telemetry.shutdown()
    return EXIT_OK


def _claude_precompact(args: argparse.Namespace) -> int:
    from policyhook.adapters.claude_code import main as precompact

    return precompact(args.rest)


def _claude_postcompact(args: argparse.Namespace) -> int:
    from policyhook.adapters.claude_postcompact import main as postcompact

    return postcompact(args.rest)


def parser() -> argparse.ArgumentParser:
    from policyhook import __version__, authoring

    top = argparse.ArgumentParser(
        prog="policyhook",
        description="Gate context-compaction calls with CEL policies over provenance.",
        epilog="Exit codes: 0 ok, 1 problem found, 2 usage or input error.",
    )
    top.add_argument("--version", action="version", version=f"policyhook {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="run the seed scenario: four compactions, the laundering pass refused"
    )
    demo.add_argument(
        "--otlp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="export spans and metrics over OTLP (default: when OTEL_EXPORTER_OTLP_ENDPOINT "
        "is set)",
    )
    demo.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get(STORE_ENV),
        help="keep provenance in a shared store: postgresql://..., redis://..., "
        f"sqlite:///path.db (default: ${STORE_ENV}, else in memory)",
    )
    demo.set_defaults(run=_demo)

    authoring.add_commands(commands)

    claude = commands.add_parser(
        "claude-precompact",
        help="Claude Code PreCompact hook: reads the hook JSON on stdin, allows or blocks",
        add_help=False,
    )
    claude.add_argument("rest", nargs=argparse.REMAINDER)
    claude.set_defaults(run=_claude_precompact)
    post = commands.add_parser(
        "claude-postcompact",
        help="Claude Code PostCompact and SessionStart(compact) hook: checks the summary's facts",
        add_help=False,
    )
    post.add_argument("rest", nargs=argparse.REMAINDER)
    post.set_defaults(run=_claude_postcompact)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["claude-precompact"]:
        # Its options are its own: argparse.REMAINDER rejects a leading "--store", and argparse's
        # exit code 2 would tell Claude Code to block the compaction.
        return _claude_precompact(argparse.Namespace(rest=argv[1:]))
    if argv[:1] == ["claude-postcompact"]:
        return _claude_postcompact(argparse.Namespace(rest=argv[1:]))
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
