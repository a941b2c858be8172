"""Generated conformance: whatever passes the load-time check decides the same on both backends.

Hypothesis writes expressions over the activation (well typed, and now and then with an operand
of the wrong type) and activations at the edges (int64 limits, huge and tiny doubles, NaN,
non-BMP text, 10,000 sources). For each expression:
- policyhook's checker and Google's (cel-expr-python) agree: ours never accepts what Google's
  rejects, so the check is the same with or without the `fast` extra;
- if it loads, cel-python and cel-expr-python give the same effect, rule and errors on every
  activation (error texts are backend-specific and not compared).
The example budget is fixed and derandomized, so a run takes the same time and finds the same
cases; a failure prints the expression and the activation.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyhook import _backends as backends
from policyhook import _celcheck
from policyhook._activation import CEL_TYPES
from policyhook._cel import Backend, EvaluationError, parse
from policyhook._errors import PolicyError
from policyhook._loader import compile_sources
from policyhook._policy import Decision, PolicySet

pytestmark = pytest.mark.skipif(
    not backends.fast_backend_installed(), reason="needs both backends (policyhook[fast])"
)
EXAMPLES = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

INT64 = (0, 1, -1, 2, 7, 2**31, 2**63 - 1, -(2**63), 2**63 - 2)
DOUBLES = (0.0, -0.0, 0.5, 1.0, 1.5, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan)
IDS = ("", "cfg-1", "tool-2", "a", "é", "😀", "x" * 40, "cfg-1 ", "ünïcode")

# -- expressions ----------------------------------------------------------------------------

INT_FIELDS = (
    "region.depth",
    "region.tokens",
    "region.chars",
    "request.attempt",
    "window.tokens",
    "window.budget",
    "window.max_depth",
)
STRING_FIELDS = ("region.id", "region.kind", "request.trigger", "window.id", "summarizer.name")
LIST_FIELDS = (
    "region.sources",
    "region.live_sources",
    "region.dead_sources",
    "region.source_kinds",
)
BOOL_FIELDS = ("summarizer.lossless", "summarizer.idempotent")
INT_LITERALS = ("0", "1", "2", "-1", "9223372036854775807", "-9223372036854775807", "3000000000")
DOUBLE_LITERALS = ("0.0", "0.5", "1.5", "-2.5", "1e308", "1e-300", "2.0")
STRING_LITERALS = ("''", "'a'", "'cfg'", "'😀'", "'summary'", "'cfg-1'")
TYPES = ("int", "double", "string", "bool", "list")


def leaf(kind: str) -> st.SearchStrategy[str]:
    choices = {
        "int": INT_FIELDS + INT_LITERALS,
        "double": ("request.budget_pressure", *DOUBLE_LITERALS),
        "string": STRING_FIELDS + STRING_LITERALS,
        "bool": (*BOOL_FIELDS, "true", "false"),
        "list": (*LIST_FIELDS, "[]", "['a', 'cfg-1']"),
    }[kind]
    return st.sampled_from(choices)


@st.composite
def expression(draw: st.DrawFn, kind: str, depth: int = 3) -> str:
    """A CEL expression of type `kind` (or, rarely, of some other type: the checker's job)."""
    if draw(st.integers(0, 30)) == 0:
        kind = draw(st.sampled_from(TYPES))  # an operand of the wrong type now and then
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(leaf(kind))

    def sub(k: str) -> str:
        return draw(expression(k, depth - 1))

    if kind == "int":
        form = draw(st.integers(0, 6))
        if form == 0:
            return f"size({sub('list')})"
        if form == 1:
            return f"size({sub('string')})"
        if form == 2:
            return f"int({sub('double')})"
        if form == 3:
            return f"-({sub('int')})"
        if form == 4:
            return f"({sub('bool')} ? {sub('int')} : {sub('int')})"
        op = draw(st.sampled_from(["+", "-", "*", "/", "%"]))
        return f"({sub('int')} {op} {sub('int')})"
    if kind == "double":
        form = draw(st.integers(0, 3))
        if form == 0:
            return f"double({sub('int')})"
        if form == 1:
            return f"-({sub('double')})"
        op = draw(st.sampled_from(["+", "-", "*", "/"]))
        return f"({sub('double')} {op} {sub('double')})"
    if kind == "string":
        form = draw(st.integers(0, 3))
        if form == 0:
            return f"string({sub(draw(st.sampled_from(['int', 'double', 'bool'])))})"
        if form == 1:
            return f"({sub('string')} + {sub('string')})"
        if form == 2:
            return f"{sub('list')}[{sub('int')}]"
        return f"({sub('bool')} ? {sub('string')} : {sub('string')})"
    if kind == "list":
        form = draw(st.integers(0, 2))
        if form == 0:
            return f"{sub('list')}.filter(s, {predicate(draw, depth)})"
        if form == 1:
            return f"{sub('list')}.map(s, s + {sub('string')})"
        return f"({sub('list')} + {sub('list')})"
    form = draw(st.integers(0, 7))
    if form == 0:
        operand = draw(st.sampled_from(["int", "double", "string"]))
        op = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
        return f"{sub(operand)} {op} {sub(operand)}"
    if form == 1:
        return f"({sub('bool')} {draw(st.sampled_from(['&&', '||']))} {sub('bool')})"
    if form == 2:
        return f"!({sub('bool')})"
    if form == 3:
        return f"{sub('string')} in {sub('list')}"
    if form == 4:
        macro = draw(st.sampled_from(["all", "exists", "exists_one"]))
        return f"{sub('list')}.{macro}(s, {predicate(draw, depth)})"
    if form == 5:
        method = draw(st.sampled_from(["startsWith", "endsWith", "contains"]))
        return f"{sub('string')}.{method}({sub('string')})"
    if form == 6:
        return f"{sub('list')} == {sub('list')}"
    return draw(leaf("bool"))


def predicate(draw: st.DrawFn, depth: int) -> str:
    """A condition over the macro variable `s` (a string)."""
    form = draw(st.integers(0, 3))
    other = draw(expression("string", depth - 2))
    if form == 0:
        return f"s.startsWith({other})"
    if form == 1:
        return f"s == {other}"
    if form == 2:
        return f"size(s) > {draw(expression('int', depth - 2))}"
    return f"s in {draw(expression('list', depth - 2))}"


# -- activations ----------------------------------------------------------------------------


@st.composite
def activations(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    many = draw(st.integers(0, 40)) == 0
    if many:
        sources = [f"src-{i:05d}" for i in range(10_000)]
    else:
        sources = sorted(set(draw(st.lists(st.sampled_from(IDS), max_size=5))))
    dead = sources[::3] if many else [s for s in sources if draw(st.booleans())]
    gone = set(dead)
    live = [s for s in sources if s not in gone]

    def an_int() -> int:
        return draw(st.one_of(st.sampled_from(INT64), st.integers(-(2**63), 2**63 - 1)))

    return {
        "region": {
            "id": draw(st.sampled_from(IDS)),
            "kind": draw(st.sampled_from(["original", "summary"])),
            "depth": an_int(),
            "sources": sources,
            "live_sources": live,
            "dead_sources": dead,
            "source_kinds": sorted(set(draw(st.lists(st.sampled_from(IDS), max_size=3)))),
            "tokens": an_int(),
            "chars": an_int(),
        },
        "request": {
            "trigger": draw(st.sampled_from(["automatic", "manual"])),
            "budget_pressure": draw(st.one_of(st.sampled_from(DOUBLES), st.floats())),
            "attempt": an_int(),
        },
        "window": {
            "id": draw(st.sampled_from(IDS)),
            "tokens": an_int(),
            "budget": an_int(),
            "max_depth": an_int(),
        },
        "summarizer": {
            "name": draw(st.sampled_from(IDS)),
            "lossless": draw(st.booleans()),
            "idempotent": draw(st.booleans()),
        },
    }


# -- comparing ------------------------------------------------------------------------------


def document(expr: str, failure: str) -> str:
    return (
        "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: generated}\n"
        f"spec:\n  failurePolicy: {failure}\n  rules:\n"
        f"    - name: r\n      expression: {expr!r}\n      message: refused\n"
    )


def load(expr: str, backend: Backend, failure: str = "deny") -> PolicySet | None:
    try:
        return compile_sources([("g.yaml", document(expr, failure))], backend=backend)
    except PolicyError:
        return None


def outcome(decision: Decision) -> tuple[Any, ...]:
    return (
        decision.effect,
        decision.rule,
        decision.message if not decision.errors else None,
        [(e.policy, e.rule) for e in decision.errors],
        # the cost limit is decided before evaluation: its text is the same on both backends
        [e.error for e in decision.errors if e.error and e.error.startswith("cost limit")],
    )


def by_name(name: str) -> Backend:
    return next(b for b in backends.available_backends() if b.name == name)


SLOW, FAST = by_name(backends.CEL_PYTHON), by_name(backends.CEL_EXPR_PYTHON)


def ours_accepts(expr: str) -> bool:
    try:
        _celcheck.check(parse(expr), expr, CEL_TYPES, {})
    except (_celcheck.CheckError, Exception):
        return False
    return True


class TestCheckersAgree:
    @EXAMPLES
    @given(expression("bool"))
    def test_ours_never_accepts_what_googles_rejects(self, expr: str) -> None:
        """Without the fast extra the load check rejects every expression Google's checker does."""
        native = backends.native_checker()
        assert native is not None, "protobuf is needed for Google's checker: pip install protobuf"
        if ours_accepts(expr):
            problem = native(expr, {})
            assert problem is None, f"{expr!r}: Google's checker says {problem}"

    def test_generator_makes_both_kinds(self) -> None:
        """The generator yields expressions the checker accepts and ones it rejects."""
        seen: set[bool] = set()

        @settings(max_examples=60, deadline=None, derandomize=True)
        @given(expression("bool"))
        def run(expr: str) -> None:
            seen.add(ours_accepts(expr))

        run()
        assert seen == {True, False}


class TestBackendsAgree:
    @EXAMPLES
    @given(expression("bool"), st.lists(activations(), min_size=1, max_size=2))
    def test_loaded_expressions_decide_alike(
        self, expr: str, cases: list[dict[str, dict[str, Any]]]
    ) -> None:
        """An expression that loads gives the same effect, rule and errors on both backends."""
        slow, fast = load(expr, SLOW), load(expr, FAST)
        assert (slow is None) == (fast is None), f"{expr!r} loads on one backend only"
        if slow is None or fast is None:
            return
        for act in cases:
            first, second = slow.decide(act), fast.decide(act)
            assert outcome(first) == outcome(second), (
                f"{expr!r} on {act['region']['depth']=}, {len(act['region']['sources'])} sources:"
                f"\n  cel-python: {first.effect} {first.errors}"
                f"\n  cel-expr-python: {second.effect} {second.errors}"
            )


EDGE_RULES = [
    "region.sources.all(s, s != 'x')",
    "region.dead_sources.exists(s, s.startsWith('src-0'))",
    "region.sources.filter(s, s in region.live_sources).size() >= 0",
    "size(region.sources) > 0 && 'src-00001' in region.live_sources",
    "region.tokens + 1 > region.tokens",
    "window.tokens * 2 > 0",
    "request.budget_pressure * 2.0 > 1.0",
    "int(request.budget_pressure) >= 0",
    "request.attempt - 1 < request.attempt",
    "-region.depth <= 0",
    "-request.budget_pressure / 0.0 < 0.0",
    "request.budget_pressure / (request.budget_pressure - request.budget_pressure) > 0.0",
    "int(-request.budget_pressure * 1e300) < 0 && uint(request.budget_pressure) >= 0u",
]


class TestEdges:
    @pytest.mark.parametrize("expr", EDGE_RULES)
    @pytest.mark.parametrize("failure", ["deny", "allow"])
    @pytest.mark.parametrize(
        "edge",
        [
            {"sources": 10_000},
            {"sources": 9_999},
            {"tokens": 2**63 - 1, "pressure": 1e308},
            {"tokens": -(2**63), "pressure": -math.inf},
            {"tokens": 2**63, "pressure": math.nan},
            {"tokens": 10**30, "pressure": 5e-324},
            {"id": "cut \ud83d emoji"},
        ],
        ids=[
            "10000-sources",
            "9999-sources",
            "int64-max",
            "int64-min",
            "past-int64",
            "1e30",
            "lone-surrogate",
        ],
    )
    def test_edges_decide_alike(self, expr: str, failure: str, edge: dict[str, Any]) -> None:
        """At 10,000 sources, the int64 limits, huge doubles and lone surrogates both backends agree."""
        slow, fast = load(expr, SLOW, failure), load(expr, FAST, failure)
        assert slow is not None and fast is not None
        n = edge.get("sources", 3)
        sources = [f"src-{i:05d}" for i in range(n)]
        if "id" in edge:
            sources[1] = edge["id"]
        act = {
            "region": {
                "id": "r",
                "kind": "summary",
                "depth": 2,
                "sources": sources,
                "live_sources": sources[1:],
                "dead_sources": sources[:1],
                "source_kinds": ["config_read"],
                "tokens": edge.get("tokens", 10),
                "chars": 40,
            },
            "request": {
                "trigger": "automatic",
                "budget_pressure": edge.get("pressure", 0.5),
                "attempt": edge.get("tokens", 1),
            },
            "window": {"id": "w", "tokens": edge.get("tokens", 5), "budget": 0, "max_depth": 2},
            "summarizer": {"name": "s", "lossless": False, "idempotent": False},
        }
        first, second = slow.decide(act), fast.decide(act)
        assert outcome(first) == outcome(second)
        for decision in (first, second):  # never an exception: a decision with a reason
            assert decision.effect in ("allow", "deny")
            if decision.errors:
                assert decision.effect == ("deny" if failure == "deny" else "allow")


def _string_of(expr: str) -> list[Any]:
    """`expr` (a `string(...)` of literals) evaluated on both backends, as Python values."""
    out = []
    for backend in (SLOW, FAST):
        out.append(backend.to_python(backend.compile(expr).evaluate(backend.context({}))))
    return out


class TestStringConversions:
    """cel-python's `string()` of a bool, duration or timestamp departs from CEL (found by this
    module's generator at 15x its budget: `region.id < string(summarizer.lossless)` allowed on
    one backend and denied on the other); policyhook corrects it (`policyhook._cel._string`)."""

    @pytest.mark.parametrize(
        ("expr", "expected"),
        [
            ("string(false)", "false"),
            ("string(true)", "true"),
            ('string(duration("-1.5s"))', "-1.500s"),
            ('string(duration("0.25s"))', "0.250s"),
            ('string(duration("1.000001s"))', "1.000001s"),
            ('string(duration("1h2m"))', "3720s"),
            ('string(timestamp("2020-01-01T05:00:00.5+05:00"))', "2020-01-01T00:00:00.500Z"),
            ('string(timestamp("0001-01-01T00:00:00Z"))', "0001-01-01T00:00:00Z"),
        ],
    )
    def test_what_cel_says(self, expr: str, expected: str) -> None:
        """Both backends give CEL's (protobuf JSON's) text."""
        assert _string_of(expr) == [expected, expected]

    @EXAMPLES
    @given(st.integers(-(10**15) + 1, 10**15 - 1))
    def test_durations_alike(self, micros: int) -> None:
        """Any duration to the microsecond within about +-31 years is written alike (cel-python
        reads the literal through a double: past 15 digits it rounds before `string`)."""
        seconds, fraction = divmod(abs(micros), 10**6)
        literal = f"{'-' if micros < 0 else ''}{seconds}.{fraction:06d}s"
        first, second = _string_of(f'string(duration("{literal}"))')
        assert first == second

    @EXAMPLES
    @given(st.datetimes(), st.integers(-14 * 60, 14 * 60))
    def test_timestamps_alike(self, when: Any, offset: int) -> None:
        """Any timestamp to the microsecond, at any UTC offset, is written alike (in UTC), or
        refused by both when it leaves years 1-9999 in UTC."""
        hours, minutes = divmod(abs(offset), 60)
        literal = (
            f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:"
            f"{when.minute:02d}:{when.second:02d}.{when.microsecond:06d}"
            f"{'-' if offset < 0 else '+'}{hours:02d}:{minutes:02d}"
        )
        results = []
        for backend in (SLOW, FAST):
            program = backend.compile(f'string(timestamp("{literal}"))')
            try:
                results.append(backend.to_python(program.evaluate(backend.context({}))))
            except EvaluationError:
                results.append(None)
        assert results[0] == results[1]

    def test_the_rule_found_decides_alike(self) -> None:
        """The generated rule that found it, on a region named below and above "false"."""
        rule = "region.id < string(summarizer.lossless)"
        slow, fast = load(rule, SLOW), load(rule, FAST)
        assert slow is not None and fast is not None
        for region_id in ("cfg-1", "zone-1"):
            act = {
                "region": {
                    "id": region_id,
                    "kind": "original",
                    "depth": 0,
                    "sources": [],
                    "live_sources": [],
                    "dead_sources": [],
                    "source_kinds": [],
                    "tokens": 1,
                    "chars": 5,
                },
                "request": {"trigger": "automatic", "budget_pressure": 0.5, "attempt": 1},
                "window": {"id": "w", "tokens": 5, "budget": 0, "max_depth": 0},
                "summarizer": {"name": "", "lossless": False, "idempotent": False},
            }
            first, second = slow.decide(act), fast.decide(act)
            assert outcome(first) == outcome(second), region_id
            assert first.effect == ("allow" if region_id < "false" else "deny")
