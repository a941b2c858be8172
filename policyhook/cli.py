"""The `policyhook` command line: every command's arguments and output, nothing else.

The work is done by the library: policies by policyhook._loader, the test runner by
policyhook._tester (public as policyhook.testing.run_tests), replay by policyhook._replay, the
demo by policyhook._demo, the Claude Code hooks by policyhook.adapters.claude_code and
claude_postcompact (their options are parsed here too, by parsers whose usage errors become the
hook's answer, never argparse's exit 2).

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
from typing import Any, NoReturn, TextIO

from policyhook._exit import Exit, HookExit

DEMO_SERVICE = "policyhook-demo"
STORE_ENV = "POLICYHOOK_STORE"
#: The Claude Code hooks' option defaults (docs/claude-code.md).
CLAUDE_STORE_ENV = "POLICYHOOK_CLAUDE_STORE"
AUTO_REFUSAL_ENV = "POLICYHOOK_CLAUDE_ON_AUTO_REFUSAL"
TIME_BUDGET_ENV = "POLICYHOOK_CLAUDE_TIME_BUDGET"
SYNCHRONOUS_ENV = "POLICYHOOK_CLAUDE_STORE_SYNCHRONOUS"
STATE_DIR_ENV = "POLICYHOOK_GROUNDING_DIR"
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


# -- retrieve, demo -----------------------------------------------------------------------------


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
    from policyhook import otel
    from policyhook._demo import run

    telemetry = None
    try:
        if args.otlp:
            telemetry = otel.configure(service_name=DEMO_SERVICE)
        elif args.otlp is None:
            telemetry = otel.configure_from_environment(DEMO_SERVICE)
    except ImportError as exc:
        if args.otlp:
            raise UsageError(f"--otlp: {exc}") from None
        variable = otel.endpoint_from_environment()
        print(f"policyhook demo: not exporting to ${variable}: {exc}", file=sys.stderr)
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


# -- the Claude Code hooks ----------------------------------------------------------------------
# Their usage errors are answered in Claude Code's hook protocol, never with argparse's exit 2:
# Claude Code reads 2 as "block" only when bash runs the hook, and every other code as a
# non-blocking error (for PreCompact: compact ungated). So a hook's parser raises instead.


class HookUsageError(Exception):
    """A hook's bad command line: the hook answers it (claude-precompact: fail closed)."""


class _HookParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise HookUsageError(message)


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return value

    return parse


def _env(name: str, fallback: Any) -> Any:
    return os.environ.get(name) or fallback


def _precompact_parser() -> argparse.ArgumentParser:
    from policyhook.adapters import claude_code as hook

    parser = _HookParser(
        prog="policyhook claude-precompact",
        description="Claude Code PreCompact hook: reads the hook input JSON on stdin, allows the "
        'compaction or answers {"decision": "block"}; always exits 0.',
    )
    parser.add_argument(
        "--policies",
        type=Path,
        help="policy YAML file or folder (default: the embedded default policy)",
    )
    parser.add_argument(
        "--store",
        type=Path,
        default=Path(_env(CLAUDE_STORE_ENV, hook.DEFAULT_STORE)),
        help=f"SQLite store where originals are archived (default: ${CLAUDE_STORE_ENV} or "
        f"{hook.DEFAULT_STORE})",
    )
    parser.add_argument(
        "--store-synchronous",
        choices=("NORMAL", "FULL"),
        default=_env(SYNCHRONOUS_ENV, "NORMAL"),
        help="SQLite's synchronous for the store: NORMAL (default) loses nothing to a crashed "
        "process, FULL nothing to a power loss either, for an fsync per record "
        f"(default: ${SYNCHRONOUS_ENV} or NORMAL)",
    )
    parser.add_argument(
        "--decision-log", type=Path, help="append one JSON line per decision to this file"
    )
    parser.add_argument(
        "--on-auto-refusal",
        choices=hook.AUTO_REFUSALS,
        default=_env(AUTO_REFUSAL_ENV, "pin"),
        help="a refused automatic compaction: pin (default: archive the history, let it go "
        "ahead, hand the exact facts to the next window through SessionStart) or block",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(_env(STATE_DIR_ENV, hook.DEFAULT_STATE_DIR)),
        help="per-session state shared with claude-postcompact (pins for the next SessionStart)",
    )
    parser.add_argument(
        "--context-window",
        type=_positive(int),
        default=hook.DEFAULT_CONTEXT_WINDOW,
        help="the model's context window in tokens, for request.budget_pressure "
        f"(default {hook.DEFAULT_CONTEXT_WINDOW})",
    )
    parser.add_argument(
        "--time-budget",
        type=_positive(float),
        default=_env(TIME_BUDGET_ENV, hook.DEFAULT_TIME_BUDGET),
        help="seconds the whole hook may take; past it, it blocks (fail closed). Keep it below "
        f"the hook's `timeout` in Claude Code's settings (default: ${TIME_BUDGET_ENV} or "
        f"{hook.DEFAULT_TIME_BUDGET:g})",
    )
    parser.add_argument(
        "--max-transcript-bytes",
        type=_positive(int),
        default=hook.DEFAULT_MAX_TRANSCRIPT_BYTES,
        help="a bigger transcript is not read: blocked "
        f"(default {hook.DEFAULT_MAX_TRANSCRIPT_BYTES})",
    )
    parser.add_argument(
        "--max-line-bytes",
        type=_positive(int),
        default=hook.DEFAULT_MAX_LINE_BYTES,
        help="a longer transcript line is left out, or blocks if it names a compaction "
        f"(default {hook.DEFAULT_MAX_LINE_BYTES})",
    )
    return parser


def _claude_precompact(argv: Sequence[str]) -> int:
    """Always exit 0: a bad command line is answered with a fail-closed block."""
    from policyhook.adapters import claude_code as hook

    try:
        args = _precompact_parser().parse_args(argv)
        for option, variable, choices in (  # argparse checks no default
            ("on_auto_refusal", AUTO_REFUSAL_ENV, hook.AUTO_REFUSALS),
            ("store_synchronous", SYNCHRONOUS_ENV, ("NORMAL", "FULL")),
        ):
            if getattr(args, option) not in choices:
                raise HookUsageError(
                    f"argument --{option.replace('_', '-')} (from ${variable}): invalid choice: "
                    f"{getattr(args, option)!r} (choose from {', '.join(map(repr, choices))})"
                )
    except HookUsageError as exc:
        hook.undecided(f"bad command line: {exc}", sys.stdout)
        return HookExit.ANSWERED
    except SystemExit:  # --help
        return HookExit.ANSWERED
    options = hook.Options(
        policies=args.policies,
        store=args.store,
        store_synchronous=args.store_synchronous,
        decision_log=args.decision_log,
        on_auto_refusal=args.on_auto_refusal,
        state_dir=args.state_dir,
        context_window=args.context_window,
        time_budget=float(args.time_budget),
        limits=hook.Limits(args.max_transcript_bytes, args.max_line_bytes),
    )
    return hook.run(options)


def _claude_postcompact(argv: Sequence[str]) -> int:
    """Runs after the compaction: a bad command line is a non-blocking error (exit 1)."""
    from policyhook.adapters import claude_postcompact as hook
    from policyhook.adapters.claude_code import DEFAULT_STATE_DIR

    parser = _HookParser(
        prog="policyhook claude-postcompact",
        description="Claude Code PostCompact / SessionStart(compact) hook: checks the summary.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(_env(STATE_DIR_ENV, DEFAULT_STATE_DIR)),
        help="where per-session provenance and findings are kept "
        f"(default: ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    try:
        args = parser.parse_args(argv)
    except HookUsageError as exc:
        print(f"policyhook claude-postcompact: bad command line: {exc}", file=sys.stderr)
        return HookExit.ERROR
    except SystemExit:  # --help
        return HookExit.ANSWERED
    return hook.run(args.state_dir)


HOOKS = {"claude-precompact": _claude_precompact, "claude-postcompact": _claude_postcompact}


# -- the parser ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    from policyhook import __version__
    from policyhook.adapters import claude_code

    top = argparse.ArgumentParser(
        prog="policyhook",
        description="Gate context-compaction calls with CEL policies over provenance.",
        epilog="Exit codes: 0 ok, 1 problem found, 2 usage or unreadable input. The Claude Code "
        "hooks never exit 2: claude-precompact always exits 0, its answer on stdout; "
        "claude-postcompact exits 1 when it cannot check.",
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
        default=os.environ.get(STORE_ENV, str(claude_code.DEFAULT_STORE)),
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
        help="export spans and metrics over OTLP (default: when OTEL_EXPORTER_OTLP_ENDPOINT, "
        "or a per-signal endpoint, is set)",
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
