"""The activation `build` makes, and deciding on it: the same decisions as its plain mapping,
without sorting, listing or converting what no policy reads (issue 12)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyhook import _activation as schema
from policyhook import _backends as backends
from policyhook import _cel as cel
from policyhook._loader import compile_sources, load_default
from policyhook._policy import Decision, PolicySet
from policyhook._provenance import Region

LISTS = ("sources", "live_sources", "dead_sources", "source_kinds")
IDS = ("a", "b", "c", "d", "e")


def build(
    sources: frozenset[str] = frozenset({"b", "a", "c"}),
    dead: frozenset[str] = frozenset(),
    depth: int = 2,
    kinds: frozenset[str] = frozenset({"config_read"}),
    **given: Any,
) -> schema.Activation:
    fields: dict[str, Any] = {
        "trigger": "automatic",
        "budget_pressure": 0.5,
        "attempt": 1,
        "window_id": "w",
        "window_tokens": 10,
        "window_budget": 100,
        "window_max_depth": depth,
        "summarizer": "s",
        "lossless": False,
        "idempotent": False,
        **given,
    }
    region = Region(f"r-{depth}", depth=depth, sources=sources, source_kinds=kinds, chars=40)
    return schema.build(region, sources - dead, **fields)


def plain(activation: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The activation as plain data: what `decide` was always given (the reference path)."""
    return {name: dict(fields) for name, fields in activation.items()}


def outcome(decision: Decision) -> tuple[Any, ...]:
    """Everything but the random id and error texts (which name the runtime's identifiers)."""
    return (
        decision.effect,
        decision.policy,
        decision.rule,
        decision.mode,
        decision.remedy,
        None if decision.rule in {e.rule for e in decision.errors} else decision.message,
        tuple((v.policy, v.rule, v.error is None, v.remedy) for v in decision.violations),
        tuple((e.policy, e.rule) for e in decision.errors),
        (decision.region_id, decision.depth, decision.dead_sources),
    )


def compiled(rules: list[str], backend: cel.Backend, extra: str = "") -> PolicySet:
    body = "".join(
        f"    - name: r{i}\n      expression: {rule!r}\n      message: m{i}\n"
        f"      messageExpression: {MESSAGE!r}\n      remedy: pin\n"
        for i, rule in enumerate(rules)
    )
    text = (
        "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata:\n  name: p\n"
        f"spec:\n  failurePolicy: deny\n{extra}  rules:\n{body}"
    )
    return compile_sources([("p.yaml", text)], backend=backend, force_audit=False)


MESSAGE = (
    "region.id + ': ' + string(size(region.dead_sources)) + ' of ' "
    "+ string(region.sources.size()) + ' gone'"
)


def backend_named(name: str) -> cel.Backend:
    return next(b for b in backends.available_backends() if b.name == name)


# -- random policies over the lists: size(), .size(), exists/all, in, index --------------------

FIELD = st.sampled_from(LISTS)
ID = st.sampled_from(IDS)
ATOM = st.one_of(
    st.builds(lambda f, op, n: f"size(region.{f}) {op} {n}", FIELD,
              st.sampled_from(["==", "!=", "<", ">="]), st.integers(0, 4)),
    st.builds(lambda f, n: f"region.{f}.size() > {n}", FIELD, st.integers(0, 3)),
    st.builds(lambda i, f: f"'{i}' in region.{f}", ID, FIELD),
    st.builds(lambda i, f: f"!('{i}' in region.{f})", ID, FIELD),
    st.builds(lambda f, i: f"region.{f}.exists(s, s == '{i}')", FIELD, ID),
    st.builds(lambda f, i: f"region.{f}.all(s, s != '{i}')", FIELD, ID),
    st.builds(lambda f, n, i: f"region.{f}[{n}] == '{i}'", FIELD, st.integers(0, 3), ID),
    st.builds(lambda f: f"region.{f} == region.sources", FIELD),
    st.builds(lambda f: f"region.{f}.map(s, s + 'x')[0] == 'ax'", FIELD),
    st.builds(lambda n: f"region.depth > {n}", st.integers(0, 3)),
    st.just("region.kind == 'summary'"),
    st.just("has(region.chars) && region.tokens == 10"),
    st.just("[region][0].kind == 'summary'"),  # the region read whole
    st.just("window.tokens < window.budget && !summarizer.lossless"),
)  # fmt: skip
RULE = st.one_of(
    ATOM,
    st.builds(lambda a, b: f"({a}) && ({b})", ATOM, ATOM),
    st.builds(lambda a, b: f"({a}) || !({b})", ATOM, ATOM),
)
ACTIVATION = st.builds(
    lambda sources, dead, depth, kinds: build(
        frozenset(sources), frozenset(dead) & frozenset(sources), depth, frozenset(kinds)
    ),
    st.sets(ID, max_size=5),
    st.sets(ID, max_size=5),
    st.integers(0, 3),
    st.sets(st.sampled_from(["config_read", "user_turn", "tool_output"]), max_size=3),
)
EXTRA = st.sampled_from(
    [
        "",
        "  matchConditions:\n    - name: m\n      expression: size(region.sources) > 0\n",
        "  variables:\n    - name: gone\n      expression: size(region.dead_sources)\n",
    ]
)


class TestFlatDecidesAsTheMapping:
    """Property: deciding on the `Activation` (flat programs, only what is read, in the form
    it is read) gives exactly the decision its plain mapping gets from the original programs."""

    @pytest.mark.parametrize("name", [backends.CEL_EXPR_PYTHON, backends.CEL_PYTHON])
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(rules=st.lists(RULE, min_size=1, max_size=3), extra=EXTRA, data=st.data())
    def test_random_policies(
        self, name: str, rules: list[str], extra: str, data: st.DataObject
    ) -> None:
        """size()/exists()/all/in/index/equality on the lists, scalars, a whole region."""
        if name == backends.CEL_EXPR_PYTHON and not backends.fast_backend_installed():
            pytest.skip("cel-expr-python is not installed")
        policies = compiled(rules, backend_named(name), extra)
        for _ in range(3):
            act = data.draw(ACTIVATION)
            reference = plain(copy.deepcopy(act))  # read apart: `act` has made no list yet
            assert outcome(policies.decide(act)) == outcome(policies.decide(reference))
            fresh = copy.deepcopy(act)
            explained = policies.decide(fresh, explain=True)
            assert outcome(explained) == outcome(policies.decide(reference, explain=True))
            assert explained.explanation == policies.decide(reference, explain=True).explanation


#: Scalars for the allow cache to tell apart: bools from ints, -0.0 from 0.0, kinds, depths.
SCALAR_ATOM = st.one_of(
    ATOM,
    st.just("1.0 / request.budget_pressure > 0.0"),  # -0.0 and 0.0 decide apart
    st.just("summarizer.lossless || request.attempt == 1"),
    st.just("!summarizer.idempotent && region.depth != request.attempt"),
    st.builds(lambda n: f"window.max_depth <= {n}", st.integers(0, 3)),
)
SCALAR_RULE = st.one_of(SCALAR_ATOM, st.builds(lambda a, b: f"({a}) || ({b})", SCALAR_ATOM, ATOM))
MANY = st.builds(
    lambda sources, dead, depth, kinds, pressure, attempt, lossless: build(
        frozenset(sources), frozenset(dead) & frozenset(sources), depth, frozenset(kinds),
        budget_pressure=pressure, attempt=attempt, lossless=lossless,
    ),
    st.sets(ID, max_size=3),
    st.sets(ID, max_size=3),
    st.integers(0, 2),
    st.sets(st.sampled_from(["config_read", "user_turn"]), max_size=2),
    st.sampled_from([0.0, -0.0, 0.5, 1.0]),
    st.integers(1, 2),
    st.booleans(),
)  # fmt: skip


class TestAllowedKeptDecidesAsEvaluating:
    """Property: a policy set that skips evaluating values it was shown to allow (`_Allowed`)
    decides every activation of a sequence exactly as the plain mapping evaluated afresh."""

    @pytest.mark.parametrize("name", [backends.CEL_EXPR_PYTHON, backends.CEL_PYTHON])
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        rules=st.lists(SCALAR_RULE, min_size=1, max_size=3),
        extra=EXTRA,
        acts=st.lists(MANY, min_size=2, max_size=12),
    )
    def test_random_policies_and_sequences(
        self, name: str, rules: list[str], extra: str, acts: list[schema.Activation]
    ) -> None:
        """Each activation decided twice (the second may be served as kept) and against the
        mapping, which is never kept: the same decision every time."""
        if name == backends.CEL_EXPR_PYTHON and not backends.fast_backend_installed():
            pytest.skip("cel-expr-python is not installed")
        policies = compiled(rules, backend_named(name), extra)
        for act in acts:
            reference = outcome(policies.decide(plain(copy.deepcopy(act))))
            assert outcome(policies.decide(copy.deepcopy(act))) == reference
            assert outcome(policies.decide(act)) == reference

    def test_kept_only_for_allows_of_the_same_values(self, backend: cel.Backend) -> None:
        """The default set: an allow is kept by the values its rules read (not the depth,
        which only its message reads); a dead source is refused after any number of allows."""
        policies = load_default(backend=backend)
        allowed = policies._allowed["input"]
        kept = 0 if not backend.binds else 1  # cel-python: no whole program (no cel.bind)
        for depth in (1, 2, 3):
            assert policies.decide(build(depth=depth)).effect == "allow"
        assert len(allowed.seen) == kept
        refused = policies.decide(build(dead=frozenset({"a"})))
        assert (refused.effect, refused.rule) == ("deny", "live-sources")
        assert refused.message.startswith("re-summarizing a depth-2 summary with 1 of 3")
        assert len(allowed.seen) == kept  # never a refusal
        assert policies.decide(build(lossless=1)).effect == "deny"  # unreadable: not kept
        assert len(allowed.seen) == kept

    def test_minus_zero_is_not_zero(self, backend: cel.Backend) -> None:
        """0.0 and -0.0 are equal in Python and decide apart in CEL (1.0 / x): kept apart."""
        policies = compiled(["1.0 / request.budget_pressure > 0.0"], backend)
        for pressure in (0.0, -0.0, 0.0, -0.0):
            act = build(budget_pressure=pressure)
            reference = outcome(policies.decide(plain(copy.deepcopy(act))))
            assert outcome(policies.decide(act)) == reference

    def test_a_list_bound_is_never_kept(self, backend: cel.Backend) -> None:
        """A list among the values bound (it could hold what cannot be converted): evaluated
        every time."""
        policies = compiled(["'a' in region.sources || region.depth >= 0"], backend)
        assert policies.decide(build()).effect == "allow"
        assert "input" not in policies._allowed


class TestNothingMadeThatIsNotRead:
    """At a rolling chain's k-th pass the region rests on k sources: what the default set
    does not read (the ids themselves) is never sorted, listed or converted."""

    def test_default_set_binds_sizes_not_lists(self, backend: cel.Backend) -> None:
        """The embedded default reads 4 region fields and 2 of the summarizer's, lists as sizes."""
        _, _, flat = load_default(backend=backend)._phases["input"]
        assert flat is not None
        assert sorted(flat[1].attributes) == [
            "region_dead_sources_size", "region_depth", "region_kind", "region_sources_size",
            "summarizer_idempotent", "summarizer_lossless",
        ]  # fmt: skip

    @pytest.mark.parametrize("dead", [0, 1, 3_000])
    def test_deciding_sorts_nothing(self, backend: cel.Backend, dead: int) -> None:
        """3,000 sources: decided (and refused) without a list of them made; only a refusal
        sorts what it names, the dead sources."""
        ids = frozenset(f"src-{i:05d}" for i in range(3_000))
        gone = frozenset(sorted(ids)[:dead])
        act = build(ids, gone)
        decision = load_default(backend=backend).decide(act, phase="input")
        assert set(act._sorted) == ({"dead_sources"} if dead else set())
        assert act._live is (None if dead else ids)  # nor the live ones told apart
        assert decision.effect == ("deny" if dead else "allow")
        assert decision.dead_sources == tuple(sorted(gone))

    def test_constant_cost_bounds_are_not_recomputed(
        self, backend: cel.Backend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Past 1,000 sources only an expression whose cost grows with them is bounded again
        per decision; `size()` costs the same at any k."""
        from policyhook import _celcheck

        default = load_default(backend=backend)
        costly = compiled(["region.sources.all(s, s != 'x')"], backend)
        calls: list[Mapping[str, int]] = []
        over = _celcheck.over_limits

        def counted(checked: _celcheck.Checked, sizes: Mapping[str, int]) -> str | None:
            calls.append(sizes)
            return over(checked, sizes)

        monkeypatch.setattr(_celcheck, "over_limits", counted)
        many = build(frozenset(f"s{i}" for i in range(3_000)))
        default.decide(many)
        assert calls == []
        assert costly.decide(many).effect == "allow"
        assert calls and calls[0]["region.sources"] == 3_000

    def test_a_list_read_by_in_only_is_not_sorted(self, backend: cel.Backend) -> None:
        """`x in region.sources` gets the items in any order; indexing gets them sorted."""
        act = build()
        assert compiled(["'a' in region.sources"], backend).decide(act).effect == "allow"
        assert act._sorted == {}
        assert compiled(["region.sources[0] == 'a'"], backend).decide(act).effect == "allow"
        assert act._sorted == {"sources": ["a", "b", "c"]}

    def test_telemetry_reads_counts(self) -> None:
        """The span's source counts come off the activation, not from its lists."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from policyhook._telemetry import Telemetry

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        telemetry = Telemetry(tracer_provider=provider)
        act = build(dead=frozenset({"a"}))
        decision = load_default().decide(act)
        with telemetry.guarded("s") as span:
            telemetry.decided(span, decision, act, 0.001)
        attributes = exporter.get_finished_spans()[0].attributes or {}
        counts = [attributes[f"policyhook.region.{n}"] for n in LISTS[:3]]
        assert counts == [3, 2, 1]
        assert set(act._sorted) == {"dead_sources"}  # what the refusal names, sorted


class TestValuesAreChecked:
    """Every scalar is checked once, in `build`; list items where a policy reads them. What
    CEL cannot hold is decided by failurePolicy, with the field named, never raised."""

    @pytest.mark.parametrize(
        ("given", "reason"),
        [
            ({"window_tokens": 2**63}, "window.tokens is 9223372036854775808, outside CEL's int"),
            ({"window_tokens": "5"}, "window.tokens must be int, got '5'"),
            ({"attempt": True}, "request.attempt must be int, got True"),
            ({"summarizer": "cut \ud83d"}, "summarizer.name holds a lone surrogate"),
            ({"budget_pressure": "0.5"}, "request.budget_pressure must be float, got '0.5'"),
            ({"tokens": 10**30}, "region.tokens is about 10^30, outside CEL's int range"),
        ],
    )
    def test_a_bad_scalar_fails_every_policy(
        self, backend: cel.Backend, given: dict[str, Any], reason: str
    ) -> None:
        """Whatever the policies read: a user-supplied value (an adapter's window tokens)."""
        decision = compiled(["region.depth >= 0"], backend).decide(build(**given))
        assert (decision.effect, decision.rule) == ("deny", "activation")
        assert reason in str(decision.errors[0].error)

    def test_a_bad_source_id_fails_where_it_is_read(self, backend: cel.Backend) -> None:
        """A lone surrogate in an id a rule reads is refused, named; a count of them is not
        changed by what the ids hold (only `size()` is read)."""
        act = build(frozenset({"a", "b\udc00"}))
        read = compiled(["region.sources.all(s, s != 'x')"], backend).decide(act)
        assert (read.effect, read.rule) == ("deny", "activation")
        assert "region.sources[1] holds a lone surrogate" in str(read.errors[0].error)
        counted = compiled(["size(region.sources) == 2"], backend).decide(act)
        assert counted.effect == "allow"


class TestAsAMapping:
    """Listeners, telemetry and the decision log read it as the plain data it always was."""

    def test_the_same_data_as_before(self) -> None:
        """Lists sorted, live and dead split in the sources' order, every field present."""
        act = build(frozenset({"c", "a", "b"}), frozenset({"b"}))
        assert plain(act) == {
            "region": {"id": "r-2", "kind": "summary", "depth": 2, "sources": ["a", "b", "c"],
                       "live_sources": ["a", "c"], "dead_sources": ["b"],
                       "source_kinds": ["config_read"], "tokens": 10, "chars": 40},
            "request": {"trigger": "automatic", "budget_pressure": 0.5, "attempt": 1},
            "window": {"id": "w", "tokens": 10, "budget": 100, "max_depth": 2},
            "summarizer": {"name": "s", "lossless": False, "idempotent": False},
        }  # fmt: skip
        assert "summary" not in act and act.get("summary") is None

    def test_read_only(self) -> None:
        """A listener cannot change what a later decision on it sees."""
        act = build()
        with pytest.raises(TypeError):
            act["region"]["depth"] = 0  # type: ignore[index]
        act["region"]["sources"].append("z")  # the readers' copy, not what policies read
        assert act.region_sources == ["a", "b", "c"]

    def test_copies_and_pickles(self) -> None:
        """By value, with fresh caches."""
        act = build(dead=frozenset({"a"}))
        assert act["region"]["dead_sources"] == ["a"]  # a cached view must not stop a copy
        for again in (copy.copy(act), copy.deepcopy(act), pickle.loads(pickle.dumps(act))):
            assert plain(again) == plain(act)

    def test_every_declared_field_is_an_attribute(self) -> None:
        """The mapping is generated from `SCHEMA`: nothing declared is missing."""
        act = build()
        for variable, fields in schema.SCHEMA.items():
            assert set(act[variable]) == {f.name for f in fields}


class TestFlatten:
    """`_cel.flatten`: each select becomes a name, size() a size, has() true."""

    @pytest.mark.parametrize(
        ("source", "expected", "uses"),
        [
            ("size(region.dead_sources) == 0", "N(dead_sources,size) == 0",
             {("dead_sources", "size")}),
            ("region.sources.size() > 1 && .region.kind == 'x'",
             "N(sources,size) > 1 && N(kind,value) == 'x'",
             {("sources", "size"), ("kind", "value")}),
            ("'a' in region.sources", "'a' in N(sources,in)", {("sources", "in")}),
            ("has(region.chars)", "true", set()),
            ("size(region.sources.filter(s, s == 'a')) > 0",
             "size(N(sources,value).filter(s, s == 'a')) > 0", {("sources", "value")}),
            ("region.sources[0] in region.live_sources",
             "N(sources,value)[0] in N(live_sources,in)",
             {("sources", "value"), ("live_sources", "in")}),
            ("size(region.id) > 0", "size(N(id,value)) > 0", {("id", "value")}),
        ],
    )  # fmt: skip
    def test_rewrites(self, source: str, expected: str, uses: set[tuple[str, str]]) -> None:
        """Only list fields become sizes or unordered; every other use reads the value."""
        lists = {("region", f) for f in LISTS}
        flat, reads = cel.flatten(source, {"region"}, lists, lambda v, f, u: f"N({f},{u})")
        assert flat == expected
        assert {(f, u) for _, f, u in reads} == uses

    def test_a_variable_used_whole_is_bound_whole(self, backend: cel.Backend) -> None:
        """A macro variable named `region` shadows it: the region is bound whole, unflattened."""
        policies = compiled(["[1].all(region, region == 1) && size(region.sources) == 3"], backend)
        _, _, flat = policies._phases["input"]
        assert flat is not None and flat[1].whole == ("region",)
        assert policies.decide(build()).effect == "allow"

    def test_names_avoid_the_policies_identifiers(self, backend: cel.Backend) -> None:
        """A macro variable named like the list of values pushes the name further."""
        policies = compiled(["region.sources.all(_v, _v != region.kind)"], backend)
        _, _, flat = policies._phases["input"]
        assert flat is not None and flat[1].name == "__v"
        assert policies.decide(build()).effect == "allow"
