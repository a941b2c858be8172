"""Conformance: every CEL backend gives the same decisions, rules and error outcomes.

Each case is decided by cel-python and by cel-expr-python (`policyhook[fast]`) and the outcomes
are compared field by field. Error texts are backend-specific and not compared; whether an error
happened, where (policy, rule) and what failurePolicy made of it are. With CI=true a missing
cel-expr-python fails the run instead of skipping it, so CI always checks both backends.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from servers import in_ci

from policyhook import _activation as schema
from policyhook import _backends as backends
from policyhook import _cel as cel
from policyhook._errors import PolicyError
from policyhook._loader import compile_sources, load_default
from policyhook._policy import Decision, PolicySet
from policyhook._provenance import Region


def _by_name(name: str) -> cel.Backend:
    return next(b for b in backends.available_backends() if b.name == name)


@pytest.fixture
def slow() -> cel.Backend:
    """cel-python, the reference backend."""
    return _by_name(backends.CEL_PYTHON)


@pytest.fixture
def fast() -> cel.Backend:
    """cel-expr-python; missing is a skip locally and a failure in CI."""
    if not backends.fast_backend_installed():
        message = "cel-expr-python is not installed: pip install 'policyhook[fast]'"
        if in_ci():
            pytest.fail(f"CI must test both CEL backends; {message}")
        pytest.skip(message)
    return _by_name(backends.CEL_EXPR_PYTHON)


@pytest.fixture
def no_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend selection tests start from no POLICYHOOK_CEL_BACKEND in the environment."""
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)


def activation(
    depth: int = 1,
    sources: tuple[str, ...] = ("cfg-1", "tool-2"),
    dead: tuple[str, ...] = (),
    lossless: bool = False,
    idempotent: bool = False,
    trigger: str = "automatic",
    pressure: float = 0.5,
) -> schema.Activation:
    region = Region(
        id=f"r-{depth}-{len(sources)}",
        depth=depth,
        sources=frozenset(sources),
        source_kinds=frozenset({"config_read"} if sources else set()),
        chars=400,
    )
    return schema.build(
        region,
        frozenset(sources) - frozenset(dead),
        trigger=trigger,
        budget_pressure=pressure,
        attempt=1,
        window_id="w-1",
        window_tokens=900,
        window_budget=1000,
        window_max_depth=depth,
        summarizer="conversation-summary",
        lossless=lossless,
        idempotent=idempotent,
    )


def outcome(decision: Decision) -> dict[str, Any]:
    """What must not depend on the backend: everything but error texts and the random id."""
    errored = bool(decision.errors) and decision.rule in {e.rule for e in decision.errors}
    return {
        "effect": decision.effect,
        "policy": decision.policy,
        "rule": decision.rule,
        "mode": decision.mode,
        "message": None if errored else decision.message,
        "violations": [
            (v.policy, v.rule, v.mode, v.error is not None, None if v.error else v.message)
            for v in decision.violations
        ],
        "errors": [(e.policy, e.rule) for e in decision.errors],
        "revision": decision.revision,
        "region": (decision.region_id, decision.depth, decision.dead_sources),
    }


def explained(decision: Decision) -> list[dict[str, Any]]:
    """The explanation with error texts replaced by a marker."""
    reports = []
    for report in decision.explanation:
        copy = dict(report)
        if "error" in copy:
            copy["error"] = str(copy["error"]).split(":")[0]  # "variable x" / "matchCondition y"
        if "rules" in copy:
            copy["rules"] = [{**r, "error": "…"} if "error" in r else r for r in copy["rules"]]
        reports.append(copy)
    return reports


def compile_both(text: str, slow: cel.Backend, fast: cel.Backend) -> tuple[PolicySet, PolicySet]:
    sources = [("policy.yaml", text)]
    return (
        compile_sources(sources, backend=slow, force_audit=False),
        compile_sources(sources, backend=fast, force_audit=False),
    )


def assert_same(
    policies: tuple[PolicySet, PolicySet], act: Mapping[str, Any]
) -> tuple[Decision, Decision]:
    first = policies[0].decide(act, explain=True)
    second = policies[1].decide(act, explain=True)
    assert outcome(first) == outcome(second)
    assert explained(first) == explained(second)
    # without explain, a policy's whole program decides first (one evaluation): the same outcome
    for each, explained_decision in zip(policies, (first, second), strict=True):
        assert outcome(each.decide(act)) == outcome(explained_decision), each.backend.name
    return first, second


def policy(rules: str, *, failure: str = "deny", extra: str = "", mode: str = "enforce") -> str:
    return f"""
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata:
  name: p
spec:
  mode: {mode}
  failurePolicy: {failure}
{extra}
  rules:
{rules}
"""


def rule(expression: str, name: str = "r", message: str = "m", message_expr: str = "") -> str:
    text = f"    - name: {name}\n      expression: {expression!r}\n      message: {message}\n"
    if message_expr:
        text += f"      messageExpression: {message_expr!r}\n"
    return text


GRID = list(
    itertools.product(
        (0, 1, 2, 5),  # depth
        ((), ("cfg-1",), ("cfg-1", "tool-2", "turn-3")),  # sources
        ("none", "some", "all"),  # which sources are dead
        (False, True),  # lossless
        (False, True),  # idempotent
        ("automatic", "manual"),
    )
)


class TestDefaultPolicy:
    @pytest.mark.parametrize(
        ("depth", "sources", "dead", "lossless", "idempotent", "trigger"),
        GRID,
        ids=lambda v: str(v) if not isinstance(v, tuple) else f"{len(v)}src",
    )
    def test_grid_decides_identically(
        self,
        slow: cel.Backend,
        fast: cel.Backend,
        depth: int,
        sources: tuple[str, ...],
        dead: str,
        lossless: bool,
        idempotent: bool,
        trigger: str,
        no_force_audit: None,
    ) -> None:
        """The default policy gives the same decision, rule and message on every backend."""
        gone = {"none": (), "some": sources[:1], "all": sources}[dead]
        act = activation(depth, sources, gone, lossless, idempotent, trigger)
        policies = (load_default(backend=slow), load_default(backend=fast))
        first, _ = assert_same(policies, act)
        expected_deny = (
            depth > 0 and not lossless and not idempotent and (bool(gone) or not sources)
        )
        assert first.effect == ("deny" if expected_deny else "allow")

    def test_refusal_message_is_the_message_expression(
        self, slow: cel.Backend, fast: cel.Backend, no_force_audit: None
    ) -> None:
        """Both backends build the same refusal text from the messageExpression."""
        act = activation(depth=3, sources=("a", "b", "c"), dead=("b",))
        first, second = assert_same((load_default(backend=slow), load_default(backend=fast)), act)
        assert first.message == second.message
        assert first.message.startswith("re-summarizing a depth-3 summary with 1 of 3 sources")


#: Errors that only evaluation can find: these expressions pass the load-time type check.
RUNTIME_ERRORS = {
    "missing-key": '{"a": 1}.b == 1',
    "missing-index": "region.sources[7] == 'x'",
    "negative-index": "region.sources[-1] == 'x'",
    "division-by-zero": "region.depth / 0 == 1",
    "modulo-by-zero": "region.depth % 0 == 1",
    "overflow": "region.depth + 9223372036854775807 > 0",
    "underflow": "-9223372036854775807 - region.depth - 1 < 0",
    "double-to-int-range": "int(request.budget_pressure * 1e30) > 0",
    "double-to-int-at-min": "int(-9223372036854775808.0) < region.depth",
    "negative-double-to-uint": "uint(-request.budget_pressure) == 0u",
    "bad-conversion": "int(region.kind) == 1",
    "non-bool-dyn": "dyn(region.depth)",
}
#: Errors the type check refuses at load; a program compiled directly still fails at evaluation.
ERRORS = {
    **RUNTIME_ERRORS,
    "no-such-overload": 'region.depth + "x" == "x"',
    "non-bool-int": "region.depth",
    "non-bool-string": "region.kind",
    "non-bool-list": "region.sources",
}


class TestErrors:
    @pytest.mark.parametrize("failure", ["deny", "allow"])
    @pytest.mark.parametrize("expression", list(RUNTIME_ERRORS.values()), ids=list(RUNTIME_ERRORS))
    def test_rule_error_reaches_failure_policy(
        self,
        slow: cel.Backend,
        fast: cel.Backend,
        expression: str,
        failure: str,
        no_force_audit: None,
    ) -> None:
        """A rule that cannot be evaluated is an error on both backends, decided by failurePolicy."""
        text = policy(rule(expression, "broken") + rule("true", "fine"), failure=failure)
        first, _ = assert_same(compile_both(text, slow, fast), activation(depth=2))
        assert [e.rule for e in first.errors] == ["broken"]
        assert first.effect == ("deny" if failure == "deny" else "allow")

    @pytest.mark.parametrize("expression", list(ERRORS.values()), ids=list(ERRORS))
    def test_program_raises_evaluation_error(self, backend: cel.Backend, expression: str) -> None:
        """Errors are raised as EvaluationError, never returned as a (truthy) value."""
        context = backend.context({k: dict(v) for k, v in activation(depth=2).items()})
        program = backend.compile(expression)
        try:
            result = backend.to_python(program.evaluate(context))
        except cel.EvaluationError:
            return
        assert not isinstance(result, bool), f"{expression!r} gave {result!r}"

    def test_short_circuit_hides_errors_alike(
        self, slow: cel.Backend, fast: cel.Backend, no_force_audit: None
    ) -> None:
        """`true || error` and `error || true` hold on both backends (CEL's commutative ||)."""
        rules = rule("region.depth > 0 || 1 / 0 == 1", "a") + rule("1 / 0 == 1 || true", "b")
        rules += rule("1 / 0 == 1 && false", "c", message="c fails")
        first, _ = assert_same(compile_both(policy(rules), slow, fast), activation(depth=1))
        assert (first.effect, first.rule, first.errors) == ("deny", "c", ())

    @pytest.mark.parametrize("failure", ["deny", "allow"])
    def test_variable_error(
        self, slow: cel.Backend, fast: cel.Backend, failure: str, no_force_audit: None
    ) -> None:
        """A variable that fails to evaluate stops its policy the same way on both backends."""
        extra = "  variables:\n    - name: ratio\n      expression: region.chars / 0\n"
        text = policy(rule("variables.ratio > 1"), failure=failure, extra=extra)
        first, _ = assert_same(compile_both(text, slow, fast), activation())
        assert [e.rule for e in first.errors] == ["variables.ratio"]
        assert first.effect == ("deny" if failure == "deny" else "allow")

    @pytest.mark.parametrize("failure", ["deny", "allow"])
    @pytest.mark.parametrize("condition", ["region.chars / 0 > 1", "dyn(region.depth)"])
    def test_match_condition_error(
        self,
        slow: cel.Backend,
        fast: cel.Backend,
        failure: str,
        condition: str,
        no_force_audit: None,
    ) -> None:
        """A failing or non-bool matchCondition is an error with the same outcome everywhere."""
        extra = f"  matchConditions:\n    - name: scope\n      expression: {condition!r}\n"
        text = policy(rule("false"), failure=failure, extra=extra)
        first, _ = assert_same(compile_both(text, slow, fast), activation())
        assert [e.rule for e in first.errors] == ["matchConditions.scope"]


class TestPolicyFeatures:
    @pytest.mark.parametrize("lossless", [False, True])
    def test_match_conditions(
        self, slow: cel.Backend, fast: cel.Backend, lossless: bool, no_force_audit: None
    ) -> None:
        """A policy whose matchCondition is false is skipped on both backends."""
        extra = "  matchConditions:\n    - name: lossy\n      expression: '!summarizer.lossless'\n"
        text = policy(rule("false", "never"), extra=extra)
        first, _ = assert_same(compile_both(text, slow, fast), activation(lossless=lossless))
        assert first.effect == ("allow" if lossless else "deny")

    def test_variables_chain(
        self, slow: cel.Backend, fast: cel.Backend, no_force_audit: None
    ) -> None:
        """Variables see earlier variables, hold lists and doubles, and read the same everywhere."""
        extra = (
            "  variables:\n"
            "    - name: gone\n      expression: region.dead_sources\n"
            "    - name: share\n"
            "      expression: double(size(variables.gone)) / double(size(region.sources))\n"
            "    - name: deep\n      expression: region.depth >= 2\n"
        )
        rules = rule("!variables.deep || variables.share < 0.5", "share")
        rules += rule('variables.gone.all(s, s.startsWith("tool"))', "tools-only")
        text = policy(rules, extra=extra)
        policies = compile_both(text, slow, fast)
        for dead in ((), ("tool-2",), ("cfg-1",), ("cfg-1", "tool-2")):
            first, _ = assert_same(policies, activation(depth=2, dead=dead))
            assert first.explanation[0]["variables"]["gone"] == sorted(dead)

    @pytest.mark.parametrize(
        ("value", "check"),
        [
            (
                'timestamp("2026-11-29T16:30:00.25Z")',
                'variables.v > timestamp("2026-01-01T00:00:00Z")',
            ),
            ('duration("90s")', 'variables.v == duration("1m30s")'),
            ('b"abc"', 'variables.v == b"abc"'),
            ("[[1.5], [2.5, 3.5]]", "variables.v[1][1] == 3.5 && size(variables.v[0]) == 1"),
            ("{'k': {'n': 1}}", "variables.v.k.n == 1"),
            ("null", "variables.v == null"),
        ],
    )
    def test_variable_values_round_trip(
        self, slow: cel.Backend, fast: cel.Backend, value: str, check: str, no_force_audit: None
    ) -> None:
        """Variables of every CEL type reach the rules unchanged on both backends."""
        extra = f"  variables:\n    - name: v\n      expression: {value!r}\n"
        text = policy(rule(check), extra=extra)
        first, _ = assert_same(compile_both(text, slow, fast), activation())
        assert (first.effect, first.errors) == ("allow", ())

    @pytest.mark.parametrize(
        "message_expr",
        [
            '"depth " + string(region.depth) + " of " + region.id',
            "region.kind + ': ' + string(size(region.dead_sources)) + ' dead'",
            "string(1 / 0)",  # an error: falls back to the message
            "dyn(region.depth)",  # not a string: falls back to the message
            "''",  # empty: falls back to the message
            "region.sources.map(s, s + '!').filter(s, s != 'x!')[0]",
        ],
    )
    def test_message_expression(
        self, slow: cel.Backend, fast: cel.Backend, message_expr: str, no_force_audit: None
    ) -> None:
        """messageExpression gives the same text, or the same fallback, on both backends."""
        text = policy(rule("false", message="static text", message_expr=message_expr))
        first, _ = assert_same(compile_both(text, slow, fast), activation(depth=2))
        assert first.message

    @pytest.mark.parametrize("mode", ["audit", "warn"])
    def test_modes(
        self, slow: cel.Backend, fast: cel.Backend, mode: str, no_force_audit: None
    ) -> None:
        """Audit and warn modes turn a denial into would_deny on both backends."""
        text = policy(rule("false"), mode=mode)
        first, _ = assert_same(compile_both(text, slow, fast), activation())
        assert first.effect == "would_deny"

    @pytest.mark.parametrize(
        "expression",
        [
            "region.sources.exists_one(s, s == 'cfg-1')",
            "region.sources.exists(s, s in region.live_sources)",
            "'config_read' in region.source_kinds",
            "region.id.matches('^r-[0-9]+')",
            "request.budget_pressure * 2.0 <= 1.0",
            "window.tokens < window.budget && window.max_depth >= 0",
            "has(region.depth) && has({'a': 1}.a)",
            "!has({'a': 1}.b) && !has(region.depth) == false",
            "has({'a': 1}.b) || region.depth > 0",
            "size(region.id) > 2 && region.id.contains('-') && region.id.endsWith('2')",
            "region.depth * 2 - 1 >= region.depth && -region.depth < 0",
            "[1, 2, 3].map(x, x * region.depth)[2] == 3 * region.depth",
            "{'a': region.depth}['a'] == region.depth",
            "region.depth > 1 ? request.trigger == 'manual' : true",
            "(region.id + region.id).contains(region.id) && (region.sources + ['x']).size() > 0",
            "-1.0 / (request.budget_pressure - request.budget_pressure) < 0.0",
        ],
    )
    @pytest.mark.parametrize("depth", [1, 2])
    @pytest.mark.parametrize("trigger", ["automatic", "manual"])
    def test_expressions(
        self,
        slow: cel.Backend,
        fast: cel.Backend,
        expression: str,
        depth: int,
        trigger: str,
        no_force_audit: None,
    ) -> None:
        """Macros, strings, maps, ternaries and has() evaluate identically on both backends."""
        text = policy(rule(expression))
        assert_same(compile_both(text, slow, fast), activation(depth=depth, trigger=trigger))

    def test_int_double_comparison_is_rejected_at_load(self, backend: cel.Backend) -> None:
        """Mixed int/double comparisons, where the backends' CEL versions differ, never load."""
        with pytest.raises(PolicyError, match="cannot compare"):
            compile_sources([("p.yaml", policy(rule("region.depth > 1.5")))], backend=backend)

    def test_syntax_error_is_located(self, backend: cel.Backend) -> None:
        """A syntax error is a CompileError with a 1-based line and column on every backend."""
        with pytest.raises(cel.CompileError) as raised:
            backend.compile("region.depth >")
        assert raised.value.line == 1
        assert raised.value.column in (14, 15)  # the last token or the end of input


class TestKnownDifferences:
    """Where cel-python departs from the CEL spec, pinned so a change is noticed and documented.

    Each is an error on cel-python (so failurePolicy decides) and a value on cel-expr-python.
    """

    @pytest.mark.parametrize(
        "expression",
        [
            "dyn(region.depth) < 1.5",  # CEL's heterogeneous numeric comparison
        ],
    )
    def test_error_only_on_cel_python(
        self, slow: cel.Backend, fast: cel.Backend, expression: str
    ) -> None:
        """cel-python raises EvaluationError where cel-expr-python gives a bool."""
        act = {k: dict(v) for k, v in activation(depth=1).items()}
        with pytest.raises(cel.EvaluationError):
            slow.compile(expression).evaluate(slow.context(act))
        result = fast.to_python(fast.compile(expression).evaluate(fast.context(act)))
        assert isinstance(result, bool)


class TestSelection:
    def test_auto_selects_fast_when_installed(
        self, fast: cel.Backend, no_backend_env: None
    ) -> None:
        """With no override, the default backend is cel-expr-python when it is installed."""
        assert backends.default_backend().name == backends.CEL_EXPR_PYTHON

    def test_auto_falls_back_to_cel_python(
        self, monkeypatch: pytest.MonkeyPatch, no_backend_env: None
    ) -> None:
        """Without the fast extra, the default backend is cel-python."""
        monkeypatch.setattr(backends, "fast_backend_installed", lambda: False)
        assert backends.default_backend().name == backends.CEL_PYTHON
        assert [b.name for b in backends.available_backends()] == [backends.CEL_PYTHON]

    @pytest.mark.parametrize("name", [backends.CEL_PYTHON, backends.CEL_EXPR_PYTHON])
    def test_env_var_overrides(
        self, monkeypatch: pytest.MonkeyPatch, fast: cel.Backend, name: str
    ) -> None:
        """POLICYHOOK_CEL_BACKEND picks the backend, whatever is installed."""
        monkeypatch.setenv(backends.BACKEND_ENV, name.upper())
        assert backends.default_backend().name == name

    def test_env_var_unknown_name(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An unknown backend name is an error naming the variable and the value."""
        monkeypatch.setenv(backends.BACKEND_ENV, "cel-go")
        with pytest.raises(ValueError, match=r"POLICYHOOK_CEL_BACKEND.*'cel-go'"):
            backends.default_backend()

    def test_env_var_names_missing_fast_backend(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Asking for cel-expr-python when it is not installed says how to install it."""
        monkeypatch.setattr(backends, "fast_backend_installed", lambda: False)
        monkeypatch.setenv(backends.BACKEND_ENV, backends.CEL_EXPR_PYTHON)
        with pytest.raises(ValueError, match=r"policyhook\[fast\]"):
            backends.default_backend()

    def test_available_backends_are_distinct(self) -> None:
        """available_backends lists each installed backend once, cel-python first."""
        names = [b.name for b in backends.available_backends()]
        assert names[0] == backends.CEL_PYTHON
        assert len(names) == len(set(names))
        if in_ci():
            assert backends.CEL_EXPR_PYTHON in names


class TestThreads:
    def test_concurrent_decisions_match_serial(
        self, backend: cel.Backend, no_force_audit: None
    ) -> None:
        """Decisions made from several threads at once equal the same decisions made serially."""
        policies = load_default(backend=backend)
        cases = [
            activation(d, s, s[:k])
            for d, s, k in itertools.product((0, 1, 3), (("a",), ("a", "b", "c")), (0, 1))
        ]
        expected = [outcome(policies.decide(a)) for a in cases]
        failures: list[str] = []

        def worker(offset: int) -> None:
            for i in range(300):
                index = (i + offset) % len(cases)
                got = outcome(policies.decide(cases[index]))
                if got != expected[index]:
                    failures.append(f"case {index}: {got} != {expected[index]}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []


def many(n: int, dead_every: int = 0) -> schema.Activation:
    """An activation over `n` sources, every `dead_every`-th of them dead (none when 0)."""
    sources = tuple(f"src-{i:05d}" for i in range(n))
    dead = sources[::dead_every] if dead_every else ()
    return activation(depth=2, sources=sources, dead=dead)


class TestCostLimit:
    """One cost limit on both backends (as Kubernetes' for ValidatingAdmissionPolicy)."""

    @pytest.mark.parametrize(
        ("expression", "reason"),
        [
            (
                "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, "
                "[1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, "
                "[1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, true))))))",
                "may iterate 1,111,110 times",
            ),
            (
                "region.sources.all(s, region.live_sources.exists(t, t == s))",
                "may iterate 1,001,000 times",
            ),
            (
                "region.sources.all(s, region.sources.all(t, t in region.live_sources))",
                "may iterate 1,001,000 times",
            ),
        ],
        ids=["six-nested-all", "quadratic-exists", "cubic-in"],
    )
    def test_costly_rules_are_refused_at_load(
        self, backend: cel.Backend, expression: str, reason: str
    ) -> None:
        """Rules whose worst case at 1,000 elements per list is over the limit never load."""
        with pytest.raises(PolicyError) as raised:
            compile_sources([("p.yaml", policy(rule(expression)))], backend=backend)
        message = str(raised.value)
        assert "cost: policy 'p' rule 'r'" in message and reason in message
        assert "with 1,000 elements in each list" in message

    @pytest.mark.parametrize("failure", ["deny", "allow"])
    def test_iteration_limit_at_10000_sources_decides_alike(
        self, slow: cel.Backend, fast: cel.Backend, failure: str, no_force_audit: None
    ) -> None:
        """.all() over 10,000 sources is over the limit on both backends: failurePolicy decides."""
        text = policy(rule("region.sources.all(s, s.startsWith('src-'))"), failure=failure)
        policies = compile_both(text, slow, fast)
        first, _ = assert_same(policies, many(10_000))
        assert [e.rule for e in first.errors] == ["r"]
        assert first.errors[0].error == (
            "cost limit: this expression may iterate 10,000 times over these lists, over the "
            "limit of 9,999 per evaluation"
        )
        assert first.effect == ("deny" if failure == "deny" else "allow")
        below, _ = assert_same(policies, many(9_999))  # just under the limit: evaluated
        assert (below.effect, below.errors) == ("allow", ())

    def test_scan_cost_limit_decides_alike(
        self, slow: cel.Backend, fast: cel.Backend, no_force_audit: None
    ) -> None:
        """A rule that scans a list per element fails closed once the scans pass the cost limit."""
        text = policy(rule("region.sources.all(s, s in region.sources)"))
        policies = compile_both(text, slow, fast)
        first, _ = assert_same(policies, many(3_200))
        assert first.effect == "deny" and "may cost 10,252,802 units" in str(first.errors[0].error)
        small, _ = assert_same(policies, many(100))
        assert small.effect == "allow"


class TestUnrepresentableValues:
    @pytest.mark.parametrize("failure", ["deny", "allow"])
    @pytest.mark.parametrize(
        ("variable", "field", "value", "reason"),
        [
            ("window", "tokens", 2**63, "window.tokens is 9223372036854775808, outside CEL's int"),
            ("request", "attempt", -(2**63) - 1, "request.attempt is -9223372036854775809"),
            ("region", "tokens", 10**30, "region.tokens is about 10^30, outside CEL's int range"),
            ("summarizer", "name", "cut \ud83d", "summarizer.name holds a lone surrogate"),
            ("region", "sources", ["a", "b\udc00"], "region.sources[1] holds a lone surrogate"),
        ],
    )
    def test_values_cel_cannot_hold_decide_alike(
        self,
        slow: cel.Backend,
        fast: cel.Backend,
        failure: str,
        variable: str,
        field: str,
        value: Any,
        reason: str,
        no_force_audit: None,
    ) -> None:
        """Past-int64 numbers and lone surrogates give a decision through failurePolicy, never a raise."""
        text = policy(rule("region.depth >= 0"), failure=failure)
        act = {name: dict(fields) for name, fields in activation(depth=2).items()}  # as read
        act[variable][field] = value
        first, _ = assert_same(compile_both(text, slow, fast), act)
        assert (first.rule, first.errors[0].rule) == ("activation", "activation") or (
            failure == "allow" and first.errors[0].rule == "activation"
        )
        assert reason in str(first.errors[0].error)
        assert first.effect == ("deny" if failure == "deny" else "allow")


def test_the_hosts_recursion_limit_is_left_alone() -> None:
    """Importing policyhook and compiling with cel-python keep the host's recursion limit."""
    import subprocess
    import sys

    code = (
        "import sys; sys.setrecursionlimit(1234)\n"
        "import policyhook\n"
        "from policyhook._backends import available_backends\n"
        "from policyhook._loader import load_default\n"
        "for b in available_backends(): load_default(backend=b)\n"
        "print(sys.getrecursionlimit())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1234"
