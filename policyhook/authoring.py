"""Policy authoring commands: check, eval, test and replay (modelled on opa and kyverno).

Every command takes `--format text|json`; exit codes are 0 ok, 1 a problem found (load errors,
failing tests, changed decisions with --fail-on-change), 2 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from policyhook import activation as schema
from policyhook import decisionlog
from policyhook.cel import Backend
from policyhook.errors import PolicyError
from policyhook.loader import Located, LocatingLoader, is_test_file, load
from policyhook.policy import PolicySet

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
TEST_KIND = "PolicyTest"
_TEST_KEYS = {"apiVersion", "kind", "metadata", "defaults", "cases"}
_CASE_KEYS = {"name", "input", "expect"}
_EXPECT_KEYS = {"decision", "policy", "rule"}
_EFFECTS = ("allow", "deny", "would_deny")


class UsageError(Exception):
    """Bad input to a command: reported on stderr with exit code 2."""


def add_commands(commands: Any) -> None:
    """Register the authoring subcommands on the `policyhook` parser."""

    def command(name: str, help: str, run: Any) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--format", choices=("text", "json"), default="text")
        sub.set_defaults(run=lambda args: _run(run, args))
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


def _run(command: Any, args: argparse.Namespace) -> int:
    try:
        code: int = command(args, sys.stdout)
        return code
    except PolicyError as exc:
        _emit_errors(exc, args.format, sys.stdout)
        return EXIT_PROBLEM
    except (UsageError, OSError, ValueError) as exc:
        print(f"policyhook {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _emit_errors(error: PolicyError, fmt: str, out: TextIO) -> None:
    if fmt == "json":
        issues = [
            {
                "file": i.file,
                "line": i.line,
                "column": i.column,
                "policy": i.policy,
                "rule": i.rule,
                "code": i.code,
                "message": i.message,
            }
            for i in error.issues
        ]
        json.dump({"ok": False, "errors": issues}, out, indent=2)
        out.write("\n")
    else:
        out.write(f"{error}\n")


def _check(args: argparse.Namespace, out: TextIO) -> int:
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
        json.dump(summary, out, indent=2)
        out.write("\n")
    else:
        for p in policies.policies:
            out.write(f"{p.file}: policy {p.name!r} ({p.mode}, {len(p.rules)} rules) ok\n")
        out.write(f"{len(policies.policies)} policies ok, revision {policies.revision}\n")
    return EXIT_OK


def read_document(path: str) -> Any:
    """A JSON or YAML document from a file, or stdin for '-'."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise UsageError(f"{where}: neither JSON nor YAML: {exc}") from None


def _eval(args: argparse.Namespace, out: TextIO) -> int:
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
        json.dump(result, out, indent=2)
        out.write("\n")
        return EXIT_OK
    rule = f" by {decision.policy}/{decision.rule}" if decision.rule else ""
    out.write(f"decision: {decision.effect}{rule} (revision {decision.revision})\n")
    if decision.message:
        out.write(f"message: {decision.message}\n")
    for report in decision.explanation:
        out.write(_explain_text(report))
    return EXIT_OK


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


# -- test ---------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    file: str
    line: int | None
    name: str
    status: str  # passed | failed | skipped
    expected: dict[str, Any]
    actual: dict[str, Any]
    reason: str = ""


def test_files(path: str | Path) -> list[Path]:
    """The `*_test.yaml` files beside the policies at `path`, in it and its subfolders."""
    root = Path(path)
    if root.is_file():
        candidates = [root.with_name(f"{root.stem}_test{root.suffix}")]
        return [c for c in candidates if c.exists()]
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and is_test_file(p))


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _cases(file: Path) -> Iterator[tuple[int | None, str, dict[str, Any], dict[str, Any]]]:
    """(line, name, activation, expect) for every case of a test file; UsageError on bad form."""
    try:
        document = yaml.load(file.read_text("utf-8"), Loader=LocatingLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UsageError(f"{file}:{mark.line + 1 if mark else '?'}: invalid YAML: {exc}") from None

    def fail(node: Any, key: str | None, message: str) -> UsageError:
        line = None
        if isinstance(node, Located):
            line = (node.lines.get(key, node.start) if key else node.start)[0]
        return UsageError(f"{file}:{line or '?'}: {message}")

    if not isinstance(document, Mapping) or document.get("kind") != TEST_KIND:
        raise fail(document, "kind", f"a test file must be a mapping with kind: {TEST_KIND}")
    for key in sorted(set(document) - _TEST_KEYS):
        raise fail(document, key, f"unknown key {key!r}; allowed: {', '.join(sorted(_TEST_KEYS))}")
    defaults = document.get("defaults") or {}
    cases = document.get("cases")
    if not isinstance(cases, list) or not cases:
        raise fail(document, "cases", "cases must be a non-empty list")
    for index, case in enumerate(cases):
        where = f"cases[{index}]"
        if not isinstance(case, Mapping):
            raise fail(document, "cases", f"{where} must be a mapping")
        for key in sorted(set(case) - _CASE_KEYS):
            raise fail(case, key, f"{where}: unknown key {key!r}")
        expect = case.get("expect")
        if not isinstance(expect, Mapping) or expect.get("decision") not in _EFFECTS:
            raise fail(case, "expect", f"{where}.expect.decision must be one of {_EFFECTS}")
        for key in sorted(set(expect) - _EXPECT_KEYS):
            raise fail(expect, key, f"{where}.expect: unknown key {key!r}")
        name = str(case.get("name") or where)
        try:
            activation = schema.validate(
                _deep_merge(defaults, case.get("input") or {}), where=f"{file}: {name}"
            )
        except ValueError as exc:
            raise fail(case, "input", str(exc)) from None
        line = case.start[0] if isinstance(case, Located) else None
        yield line, name, activation, dict(expect)


def run_tests(
    files: list[Path], policies: PolicySet | None = None, backend: Backend | None = None
) -> list[CaseResult]:
    """Decide every case of `files` and compare with what it expects.

    Each test file is decided by the policies of its own folder (compiled for `backend`), unless
    `policies` is given.
    """
    results = []
    sets: dict[Path, PolicySet] = {}
    for file in files:
        if policies is None and file.parent not in sets:
            sets[file.parent] = load(file.parent, backend=backend)
        policy_set = policies or sets[file.parent]
        for line, name, activation, expect in _cases(file):
            decision = policy_set.decide(activation, explain=True)
            actual = {"decision": decision.effect, "policy": decision.policy, "rule": decision.rule}
            expected: dict[str, Any] = {
                k: expect[k] for k in ("decision", "policy", "rule") if k in expect
            }
            target = expect.get("policy")
            reports = {r["policy"]: r for r in decision.explanation}
            if target is not None and target not in reports:
                status, reason = "failed", f"no policy named {target!r}"
            elif target is not None and reports[target]["matched"] is False:
                status, reason = "skipped", f"policy {target!r} did not match"
            elif all(actual[k] == v for k, v in expected.items()):
                status, reason = "passed", ""
            else:
                status, reason = "failed", ""
            results.append(CaseResult(str(file), line, name, status, expected, actual, reason))
    return results


def _test(args: argparse.Namespace, out: TextIO) -> int:
    files = test_files(args.path)
    if not files:
        raise UsageError(f"{args.path}: no test files (*_test.yaml) found")
    single = load(args.path) if Path(args.path).is_file() else None
    results = run_tests(files, single)
    counts = Counter(r.status for r in results)
    if args.format == "json":
        json.dump(
            {
                "cases": [r.__dict__ for r in results],
                "passed": counts["passed"],
                "failed": counts["failed"],
                "skipped": counts["skipped"],
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        for r in results:
            if r.status == "failed" or args.verbose:
                out.write(f"{r.status.upper()}: {r.file}:{r.line}: {r.name}\n")
            if r.status == "failed":
                out.write(f"  expected: {_brief(r.expected)}\n  actual:   {_brief(r.actual)}\n")
                if r.reason:
                    out.write(f"  reason:   {r.reason}\n")
        skipped = f", {counts['skipped']} skipped" if counts["skipped"] else ""
        out.write(f"{counts['passed']} passed, {counts['failed']} failed{skipped}\n")
    return EXIT_PROBLEM if counts["failed"] else EXIT_OK


def _brief(outcome: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v or '-'}" for k, v in outcome.items())


# -- replay -------------------------------------------------------------------------------------


def _replay(args: argparse.Namespace, out: TextIO) -> int:
    policies = load(args.path)
    transitions: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    total = changed = 0
    started = last = time.monotonic()
    for number, entry in decisionlog.read(args.log):
        try:
            activation = schema.validate(entry["activation"], where=f"{args.log}:{number}")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        decision = policies.decide(activation)
        old = (entry.get("decision"), entry.get("rule") or "")
        new = (decision.effect, decision.rule)
        transitions[f"{old[0]} -> {new[0]}"] += 1
        total += 1
        if old != new:
            changed += 1
            if len(examples) < args.examples:
                examples.append(
                    {
                        "line": number,
                        "decision_id": entry.get("decision_id"),
                        "old": {
                            "decision": old[0],
                            "rule": old[1],
                            "revision": entry.get("revision"),
                        },
                        "new": {"decision": new[0], "rule": new[1], "revision": decision.revision},
                    }
                )
        now = time.monotonic()
        if not args.quiet and now - last >= 2.0:
            last = now
            rate = total / (now - started)
            print(f"replayed {total} decisions ({rate:,.0f}/s)...", file=sys.stderr)
    elapsed = time.monotonic() - started
    if args.format == "json":
        json.dump(
            {
                "revision": policies.revision,
                "total": total,
                "changed": changed,
                "transitions": dict(sorted(transitions.items())),
                "examples": examples,
                "seconds": round(elapsed, 3),
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        out.write(f"replayed {total} decisions under revision {policies.revision} ")
        out.write(f"in {elapsed:.1f}s: {changed} would change\n")
        for transition, count in sorted(transitions.items()):
            out.write(f"  {transition:<26} {count}\n")
        for ex in examples:
            out.write(
                f"  e.g. line {ex['line']} ({ex['decision_id']}): "
                f"{ex['old']['decision']}/{ex['old']['rule'] or '-'} -> "
                f"{ex['new']['decision']}/{ex['new']['rule'] or '-'}\n"
            )
    return EXIT_PROBLEM if changed and args.fail_on_change else EXIT_OK
