"""The policy test runner: `*_test.yaml` cases decided and compared, with text and JSON reporters.

A library (`policyhook.testing.run_tests`) that `policyhook test` prints, as OPA keeps its tester
apart from its command line. The test-file format (`kind: PolicyTest`) is in docs/cli.md.

A case that names a policy (`expect.policy`) is about that policy: it fails when the policy did
not match its input, unless it says `matched: false` - so a typo in a `matchCondition`, which
silently takes a policy out of every decision, turns its tests red instead of green.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from policyhook import _activation as schema
from policyhook._cel import Backend
from policyhook._loader import Located, LocatingLoader, is_test_file, load, yaml_problem
from policyhook._policy import Effect, PolicySet

TEST_KIND = "PolicyTest"
_TEST_KEYS = {"apiVersion", "kind", "metadata", "defaults", "cases"}
_CASE_KEYS = {"name", "input", "expect"}
_EXPECT_KEYS = {"decision", "policy", "rule", "matched"}
_EFFECTS = tuple(Effect)


class PolicyTestError(ValueError):
    """A test file that cannot be run (bad YAML, unknown keys, bad input): names file and line."""


@dataclass(frozen=True)
class CaseResult:
    """One case: `status` is passed or failed; `reason` says why when it is not a plain diff."""

    file: str
    line: int | None
    name: str
    status: str
    expected: dict[str, Any]
    actual: dict[str, Any]
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def find_tests(path: str | Path) -> list[Path]:
    """The `*_test.yaml` files for the policies at `path`: beside a file, or in a folder's tree."""
    root = Path(path)
    if not root.exists():
        raise PolicyTestError(f"{path}: no such file or directory")
    if root.is_file():
        candidates = [root.with_name(f"{root.stem}_test{root.suffix}")]
        return [c for c in candidates if c.exists()]
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and is_test_file(p))


def run_tests(path: str | Path, *, backend: Backend | None = None) -> list[CaseResult]:
    """Decide every case of the tests at `path` (see `find_tests`) and compare with its `expect`.

    Each test file is decided by the policies of its own folder, compiled for `backend`; for a
    single policy file, by that file alone. PolicyTestError when there is nothing to run or a test
    file is malformed; PolicyError when the policies do not load.
    """
    files = find_tests(path)
    if not files:
        raise PolicyTestError(f"{path}: no test files (*_test.yaml) found")
    single = load(path, backend=backend) if Path(path).is_file() else None
    sets: dict[Path, PolicySet] = {}
    results: list[CaseResult] = []
    for file in files:
        if single is None and file.parent not in sets:
            sets[file.parent] = load(file.parent, backend=backend)
        policies = single or sets[file.parent]
        results += [_run_case(policies, file, *case) for case in _cases(file)]
    return results


def _run_case(
    policies: PolicySet,
    file: Path,
    line: int | None,
    name: str,
    activation: Mapping[str, Any],
    expect: Mapping[str, Any],
) -> CaseResult:
    # a case with a `summary` is about what the summarizer returned: output-phase policies decide
    phase = "output" if "summary" in activation else "input"
    decision = policies.decide(activation, explain=True, phase=phase)
    actual: dict[str, Any] = {
        "decision": decision.effect,
        "policy": decision.policy,
        "rule": decision.rule,
    }
    expected = dict(expect)
    target = expect.get("policy")
    matched = {r["policy"]: r["matched"] is not False for r in decision.explanation}

    def result(status: str, reason: str = "") -> CaseResult:
        return CaseResult(str(file), line, name, status, expected, actual, reason)

    if target is not None:
        if target not in matched:
            return result("failed", f"no policy named {target!r} ({', '.join(sorted(matched))})")
        actual["matched"] = matched[target]
        if expect.get("matched", True) and not matched[target]:
            return result(
                "failed",
                f"policy {target!r} did not match this input (its matchConditions are false); "
                "write `matched: false` in expect if the case means that",
            )
        if not expect.get("matched", True) and matched[target]:
            return result("failed", f"policy {target!r} matched; the case expects it not to")
    wrong = [key for key in ("decision", "rule") if key in expect and expect[key] != actual[key]]
    if target is not None and decision.effect != Effect.ALLOW and expect.get("matched", True):
        wrong += ["policy"] if target != decision.policy else []
    return result("failed" if wrong else "passed")


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _cases(file: Path) -> Iterator[tuple[int | None, str, dict[str, Any], dict[str, Any]]]:
    """(line, name, activation, expect) for every case of a file; PolicyTestError on bad form."""
    try:
        text = file.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyTestError(f"{file}: cannot be read: {exc}") from None
    try:
        document = yaml.load(text, Loader=LocatingLoader)
    except yaml.YAMLError as exc:
        line, _, problem = yaml_problem(exc, text)
        raise PolicyTestError(f"{file}:{line or '?'}: invalid YAML: {problem}") from None

    def fail(node: Any, key: str | None, message: str) -> PolicyTestError:
        line = None
        if isinstance(node, Located):
            line = (node.lines.get(key, node.start) if key else node.start)[0]
        return PolicyTestError(f"{file}:{line or '?'}: {message}")

    if not isinstance(document, Mapping) or document.get("kind") != TEST_KIND:
        raise fail(document, "kind", f"a test file must be a mapping with kind: {TEST_KIND}")
    for key in sorted(set(document) - _TEST_KEYS):
        raise fail(document, key, f"unknown key {key!r}; allowed: {', '.join(sorted(_TEST_KEYS))}")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise fail(document, "defaults", "defaults must be a mapping of activation fields")
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
        if "matched" in expect:
            if not isinstance(expect["matched"], bool) or "policy" not in expect:
                raise fail(
                    expect, "matched", f"{where}.expect.matched must be true or false, with policy"
                )
            if expect["matched"] is False and "rule" in expect:
                raise fail(expect, "rule", f"{where}.expect: no rule of an unmatched policy runs")
        given = case.get("input") or {}
        if not isinstance(given, Mapping):
            raise fail(case, "input", f"{where}.input must be a mapping of activation fields")
        name = str(case.get("name") or where)
        # `defaults.summary` fills in the cases that give a `summary` (even `summary: {}`): they
        # are about the output; the others are decided on the input alone
        merged = _deep_merge(defaults, given)
        output = merged.pop("summary", None) if "summary" in given else None
        merged.pop("summary", None)
        try:
            activation: dict[str, Any] = schema.validate(merged, where=f"{file}: {name}")
            if output is not None:
                activation["summary"] = _summary(output, where=f"{file}: {name}")
        except ValueError as exc:
            raise fail(case, "input", str(exc)) from None
        line = case.start[0] if isinstance(case, Located) else None
        yield line, name, activation, dict(expect)


def _summary(given: Any, where: str) -> dict[str, Any]:
    """A case's `summary` (the output-phase variable, docs/grounding.md) checked field by field:
    every field given, each of its type, no other."""
    if not isinstance(given, Mapping):
        raise ValueError(f"{where}: 'summary' must be a mapping of its fields")
    fields = {f.name: f.type for f in schema.SUMMARY}
    problems = [f"{where}: summary.{k} is not a field" for k in sorted(set(given) - set(fields))]
    for name, kind in fields.items():
        value = given.get(name)
        if name not in given:
            problems.append(f"{where}: summary.{name} ({kind}) is missing")
        elif not _of_type(value, kind):
            problems.append(f"{where}: summary.{name} must be {kind}, got {value!r}")
    if problems:
        raise ValueError("\n".join(problems))
    return {k: float(v) if fields[k] == "double" else v for k, v in given.items()}


def _of_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "double":
        return isinstance(value, (int, float))
    return isinstance(value, list) and all(isinstance(v, str) for v in value)  # list(string)


# -- reporters ----------------------------------------------------------------------------------


def summary(results: Sequence[CaseResult]) -> str:
    """The closing line: `N passed, N failed`."""
    counts = Counter(r.status for r in results)
    return f"{counts['passed']} passed, {counts['failed']} failed"


def report_text(results: Sequence[CaseResult], out: TextIO, *, verbose: bool = False) -> None:
    """Each failure with expected vs actual (every case with `verbose`), then the summary line."""
    for r in results:
        if not r.passed or verbose:
            out.write(f"{r.status.upper()}: {r.file}:{r.line}: {r.name}\n")
        if not r.passed:
            out.write(f"  expected: {_brief(r.expected)}\n  actual:   {_brief(r.actual)}\n")
            if r.reason:
                out.write(f"  reason:   {r.reason}\n")
    out.write(summary(results) + "\n")


def report_json(results: Sequence[CaseResult], out: TextIO) -> None:
    """`{"cases": [...], "passed": N, "failed": N}`."""
    counts = Counter(r.status for r in results)
    document = {
        "cases": [asdict(r) for r in results],
        "passed": counts["passed"],
        "failed": counts["failed"],
    }
    json.dump(document, out, indent=2)
    out.write("\n")


def _brief(outcome: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={'-' if v in ('', None) else v}" for k, v in outcome.items())
