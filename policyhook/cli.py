"""The `policyhook` command line: every command's arguments and output, nothing else.

The work is done by the library: policies by policyhook._loader, the test runner by
policyhook._tester (public as policyhook.testing.run_tests), replay by policyhook._replay, the
demo by policyhook._demo, the Claude Code hook by policyhook.adapters.claude_code, which parses
its own options (its usage errors must become a fail-closed answer, never an exit code).

Exit codes (policyhook._exit, docs/cli.md): 0 ok; 1 a problem found (policy errors, failed test
cases, changed decisions with --fail-on-change); 2 bad usage or unreadable input (a missing
policy path everywhere); 141 the reader of the output went away. claude-precompact always exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from policyhook._exit import Exit

OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
STORE_ENV = "POLICYHOOK_STORE"
#: The policy sets `policyhook init` writes: shipped as package data under policyhook/policy_sets/
#: and kept identical to policies/ in the repository (tests/test_policy_sets.py).
POLICY_SETS = ("default", "strict", "audit-rollout")

#: PolicyIssue codes for a policy file that cannot be read (io) or parsed as YAML (yaml): exit 2.
UNREADABLE = frozenset({"io", "yaml"})

Command = Callable[[argparse.Namespace, TextIO], int]


class UsageError(Exception):
    """Bad input to a command: one line on stderr, exit 2."""


# -- check, eval --------------------------------------------------------------------------------


def _check(args: argparse.Namespace, out: TextIO) -> int:
    from policyhook._loader import load

    policies = load(args.path)
    if args.format == "json":
        summary = {
            "ok": True,
            "revision": policies.revision,
            "policies": [
                {"name": p.name, "file": p.file, "mode": p.mode, "rules": len(p.rules)}
                for p in policies.policies
            ],
        }
        _dump(summary, out)
    else:
        for p in policies.policies:
            out.write(f"{p.file}: policy {p.name!r} ({p.mode}, {len(p.rules)} rules) ok\n")
        out.write(f"{len(policies.policies)} policies ok, revision {policies.revision}\n")
    return Exit.OK


def _finite(value: Any, where: str) -> None:
    """Reject numbers no activation field can hold (1e400 reads as infinity, NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{where or 'the document'}: {value} is not a finite number")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _finite(item, f"{where}[{index}]")


def read_document(path: str) -> Any:
    """A JSON or YAML document from a file, or stdin for '-'; UsageError when neither."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"{path}: cannot be read: {reason}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else path
            raise UsageError(f"{where}: neither JSON nor YAML: {exc}") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to be an activation") from None
    try:
        _finite(document, "")
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return document


def _eval(args: argparse.Namespace, out: TextIO) -> int:
    from policyhook import _activation as schema
    from policyhook._loader import load

    policies = load(args.path)
    document = read_document(args.input)
    if not isinstance(document, Mapping):
        raise UsageError(f"{args.input}: the input must be a mapping of region/request/...")
    activation = schema.validate(document, where=args.input)
    decision = policies.decide(activation, explain=args.explain)
    result = {
        "decision": decision.effect,
        "policy": decision.policy,
        "rule": decision.rule,
        "mode": decision.mode,
        "message": decision.message,
        "revision": decision.revision,
        "violations": [v.__dict__ for v in decision.violations],
    }
    if args.explain:
        result["explain"] = list(decision.explanation)
    if args.format == "json":
        _dump(result, out)
        return Exit.OK
    rule = f" by {decision.policy}/{decision.rule}" if decision.rule else ""
    out.write(f"decision: {decision.effect}{rule} (revision {decision.revision})\n")
    if decision.message:
        out.write(f"message: {decision.message}\n")
    for report in decision.explanation:
        out.write(_explain_text(report))
    return Exit.OK


def _explain_text(report: Mapping[str, Any]) -> str:
    lines = [f"\npolicy {report['policy']} ({report['mode']}):"]
    if report.get("error"):
        lines.append(f"  error: {report['error']}")
    if report["matched"] is False:
        lines.append(f"  not matched (matchCondition {report['condition']} is false)")
        return "\n".join(lines) + "\n"
    lines.append("  matched")
    for name, value in report.get("variables", {}).items():
        lines.append(f"  variables.{name} = {json.dumps(value)}")
    for rule in report.get("rules", []):
        outcome = f"error: {rule['error']}" if rule.get("error") else str(rule["result"]).lower()
        lines.append(f"  rule {rule['rule']}: {outcome}")
    return "\n".join(lines) + "\n"


# -- test, replay -------------------------------------------------------------------------------


def _test(args: argparse.Namespace, out: TextIO) -> int:
    from policyhook import _tester

    results = _tester.run_tests(args.path)
    if args.format == "json":
        _tester.report_json(results, out)
    else:
        _tester.report_text(results, out, verbose=args.verbose)
    return Exit.OK if all(r.passed for r in results) else Exit.PROBLEM


def _replay(args: argparse.Namespace, out: TextIO) -> int:
    from policyhook import _replay
    from policyhook._loader import load

    def progress(total: int, seconds: float) -> None:
        print(f"replayed {total} decisions ({total / seconds:,.0f}/s)...", file=sys.stderr)

    policies = load(args.path)
    if not Path(args.log).is_file():
        raise UsageError(f"{args.log}: no such decision log")
    report = _replay.replay(
        policies, args.log, examples=args.examples, progress=None if args.quiet else progress
    )
    if args.format == "json":
        _replay.report_json(report, out)
    else:
        _replay.report_text(report, out)
    return Exit.PROBLEM if report.changed and args.fail_on_change else Exit.OK


# -- init ---------------------------------------------------------------------------------------


def _init(args: argparse.Namespace, out: TextIO) -> int:
    shipped = resources.files("policyhook").joinpath("policy_sets", args.set)
    files = sorted((f for f in shipped.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)
    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target}: exists and is not a folder")
    taken = [target / f.name for f in files if (target / f.name).exists()]
    if taken:
        names = ", ".join(str(p) for p in taken)
        raise UsageError(f"{names}: already there; nothing written (init never overwrites)")
    target.mkdir(parents=True, exist_ok=True)
    for file in files:
        (target / file.name).write_bytes(file.read_bytes())
        out.write(f"wrote {target / file.name}\n")
    out.write(
        f"the {args.set!r} policy set is in {target}: `policyhook test {target}` runs its cases; "
        f'Guard.from_path("{target}") uses it\n'
    )
    return Exit.OK


# -- demo, claude-precompact --------------------------------------------------------------------


def _retrieve(args: argparse.Namespace, out: TextIO) -> int:
    """Print the texts a remedy archived under REF, exactly, one after another."""
    from policyhook._hook import Guard
    from policyhook.stores import open_store

    location = str(args.store)
    if "://" not in location and ":" not in location.split("/")[0]:
        path = Path(location).expanduser()
        if not path.is_file():
            raise UsageError(f"no store at {path}")
        location = f"sqlite:///{path.resolve()}"
    store = open_store(location)
    try:
        texts = Guard(store=store).retrieve(args.ref)
    except (KeyError, ValueError) as error:
        raise UsageError(str(error).strip('"')) from None
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    if args.format == "json":
        _dump({"ref": args.ref, "texts": texts}, out)
    else:
        out.write("\n\n".join(texts) + "\n")
    return Exit.OK


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    """Run the seed scenario; export OTLP when asked, or when the environment names an endpoint.

    The demo never needs a server: without the SDK, an endpoint from the environment is noted
    and ignored; only an explicit --otlp makes a missing SDK an error.
    """
    from policyhook._demo import run

    telemetry = None
    wanted = args.otlp if args.otlp is not None else bool(os.environ.get(OTLP_ENDPOINT_ENV))
    if wanted:
        from policyhook.otel import configure

        try:
            telemetry = configure(service_name="policyhook-demo")
        except ImportError as exc:
            if args.otlp:
                raise UsageError(f"--otlp: {exc}") from None
            print(f"policyhook demo: not exporting to ${OTLP_ENDPOINT_ENV}: {exc}", file=sys.stderr)
    guard = None
    if args.store:
        from policyhook._hook import Guard
        from policyhook.stores import open_store

        try:
            guard = Guard(store=open_store(args.store))
        except (ImportError, ValueError, ConnectionError) as exc:
            raise UsageError(f"--store: {exc}") from None
    try:
        run(out, guard)
    finally:
        if telemetry is not None:
            telemetry.shutdown()
    return Exit.OK


def _claude_precompact(argv: Sequence[str]) -> int:
    from policyhook.adapters.claude_code import main as precompact

    return precompact(argv)


def _claude_postcompact(argv: Sequence[str]) -> int:
    from policyhook.adapters.claude_postcompact import main as postcompact

    return postcompact(argv)


#: The Claude Code hooks parse their own options: their usage errors are answered in Claude
#: Code's hook protocol (claude-precompact: a fail-closed block on stdout with exit 0), which
#: argparse here (exit 2) would break.
HOOKS = {"claude-precompact": _claude_precompact, "claude-postcompact": _claude_postcompact}


# -- the parser ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    from policyhook import __version__

    top = argparse.ArgumentParser(
        prog="policyhook",
        description="Gate context-compaction calls with CEL policies over provenance.",
        epilog="Exit codes: 0 ok, 1 problem found, 2 usage or unreadable input "
        "(claude-precompact: always 0, its answer on stdout).",
    )
    top.add_argument("--version", action="version", version=f"policyhook {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, run: Command, *, formats: bool = True) -> Any:
        sub = commands.add_parser(name, help=help, description=help)
        if formats:
            sub.add_argument("--format", choices=("text", "json"), default="text")
        sub.set_defaults(run=run)
        return sub

    check = command("check", "load and type-check policies; list every error", _check)
    check.add_argument("path", help="a policy file or a folder of them")

    evaluate = command("eval", "decide one activation (JSON or YAML) under the policies", _eval)
    evaluate.add_argument("path", help="a policy file or a folder of them")
    evaluate.add_argument("--input", required=True, help="activation file (JSON/YAML, '-' stdin)")
    evaluate.add_argument(
        "--explain", action="store_true", help="show each policy's match, variables and rules"
    )

    test = command("test", "run the policy test cases (*_test.yaml) beside the policies", _test)
    test.add_argument("path", help="a policy file or a folder of them (and their tests)")
    test.add_argument("-v", "--verbose", action="store_true", help="list passing cases too")

    replay = command("replay", "re-decide a decision log under these policies", _replay)
    replay.add_argument("path", help="a policy file or a folder of them")
    replay.add_argument("log", help="a decision log (JSONL) written by DecisionLog")
    replay.add_argument("--examples", type=int, default=5, help="changed decisions to show")
    replay.add_argument(
        "--fail-on-change", action="store_true", help="exit 1 when any decision would change"
    )
    replay.add_argument("--quiet", action="store_true", help="no progress on stderr")

    init = command(
        "init", "write a shipped policy set and its tests into a folder", _init, formats=False
    )
    init.add_argument("dir", help="the folder (created if missing; existing files are kept)")
    init.add_argument("--set", choices=POLICY_SETS, default="default", help="default: default")

    retrieve = command(
        "retrieve", "print, exactly, what a remedy archived under REF (offload:...)", _retrieve
    )
    retrieve.add_argument("ref", help="the reference a remedy pointer names")
    retrieve.add_argument(
        "--store",
        default=os.environ.get(STORE_ENV, "~/.claude/policyhook/store.sqlite"),
        help="the store: a SQLite file path, or a URL as for demo --store (default: "
        f"${STORE_ENV}, else the Claude Code hook's store)",
    )

    demo = command(
        "demo",
        "run the seed scenario: four compactions, the laundering pass refused",
        _demo,
        formats=False,
    )
    demo.add_argument(
        "--otlp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"export spans and metrics over OTLP (default: when {OTLP_ENDPOINT_ENV} is set)",
    )
    demo.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get(STORE_ENV),
        help="keep provenance in a shared store: postgresql://..., redis://..., "
        f"sqlite:///path.db (default: ${STORE_ENV}, else in memory)",
    )

    # Listed for --help only: main() hands their arguments to the hooks before argparse sees them.
    commands.add_parser(
        "claude-precompact",
        help="Claude Code PreCompact hook: reads the hook JSON on stdin, allows or blocks",
        add_help=False,
    )
    commands.add_parser(
        "claude-postcompact",
        help="Claude Code PostCompact and SessionStart(compact) hook: checks the summary's facts",
        add_help=False,
    )
    return top


# -- running ------------------------------------------------------------------------------------


def _run(args: argparse.Namespace, out: TextIO) -> int:
    """Run one command; every failure it can meet becomes one line and an exit code."""
    from policyhook._errors import PolicyError
    from policyhook._tester import PolicyTestError

    prefix = f"policyhook {args.command}"
    try:
        code: int = args.run(args, out)
        return code
    except PolicyError as exc:
        _emit_errors(exc, getattr(args, "format", "text"), out)
        # Files that cannot be read or parsed are unreadable input, as a bad test file or
        # activation is; what the loader finds in a readable policy is a problem found.
        unreadable = all(issue.code in UNREADABLE for issue in exc.issues)
        return Exit.USAGE if unreadable else Exit.PROBLEM
    except BrokenPipeError:
        raise
    except (UsageError, PolicyTestError, OSError, ValueError) as exc:
        text = str(exc)  # "policyhook demo --store: ..." for an option's error
        print(f"{prefix}{' ' if text.startswith('--') else ': '}{text}", file=sys.stderr)
    except RecursionError:
        print(f"{prefix}: the input is nested too deeply", file=sys.stderr)
    except OverflowError as exc:
        print(f"{prefix}: a number in the input is out of range: {exc}", file=sys.stderr)
    return Exit.USAGE


def _emit_errors(error: Any, fmt: str, out: TextIO) -> None:
    if fmt == "json":
        fields = ("file", "line", "column", "policy", "rule", "code", "message")
        issues = [{f: getattr(i, f) for f in fields} for i in error.issues]
        _dump({"ok": False, "errors": issues}, out)
    else:
        out.write(f"{error}\n")


def _dump(document: Any, out: TextIO) -> None:
    json.dump(document, out, indent=2)
    out.write("\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in HOOKS:
        return HOOKS[argv[0]](argv[1:])
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a lone surrogate in a name prints escaped
            stream.reconfigure(errors="backslashreplace")
    try:
        args = parser().parse_args(argv)
        code = _run(args, sys.stdout)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Nothing more can be written; point stdout at /dev/null so the interpreter's final
        # flush does not fail again with a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return Exit.BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
