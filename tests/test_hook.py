"""The guard decorator: the seed scenario, sync/async/method wrapping, refusals, fail-closed paths."""

from __future__ import annotations

import asyncio
import io
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import deep
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from outage import store_down
from test_telemetry import Otel
from test_telemetry import telemetry as telemetry  # the fixture

import policyhook
from policyhook import Guard, MemoryStore, UnsafeRecompactionError
from policyhook._demo import run as run_demo
from policyhook._demo import with_remedies
from policyhook._telemetry import STORE_ERRORS
from policyhook.testing import capture_decisions

CONFIG = "config read: retry_ceiling = 7 (agent.yaml)"
AUDIT = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata: {name: shadow}
spec:
  mode: audit
  rules:
    - name: no-resummarize
      expression: region.depth == 0
      message: would refuse a summary
"""


def counting(outputs: list[str]) -> tuple[Callable[[Any], str], list[Any]]:
    calls: list[Any] = []

    def summarize(text: Any) -> str:
        calls.append(text)
        return outputs[len(calls) - 1]

    return summarize, calls


class TestSeedScenario:
    def test_granted_while_live_refused_once_evicted(self) -> None:
        """Re-summarizing is granted while the config is live and refused once it is evicted."""
        guard = Guard()
        fn, calls = counting(
            [
                "S1: retry ceiling is 7 (from config)",
                "S2: retries are capped",
                "S3: retries capped at 5",
            ]
        )
        summarize = guard(fn, summarizer="lossy")
        cfg = guard.record_source(CONFIG, "config_read", "cfg-7")
        s1 = summarize(CONFIG)
        s2 = summarize(s1)
        guard.store.evict(cfg.id)
        with pytest.raises(UnsafeRecompactionError) as refused:
            summarize(s2)
        assert len(calls) == 2  # the confabulating third pass never ran
        assert refused.value.rule == "live-sources"
        assert refused.value.policy == "default"
        assert refused.value.depth == 2
        assert refused.value.dead_sources == ("cfg-7",)
        # The window is untouched: s2 is still what the ledger knows, "5" was never recorded.
        assert guard.check(s2, summarizer="lossy").depth == 2
        assert guard.check("S3: retries capped at 5", summarizer="lossy").depth == 0

    def test_demo_refuses_the_laundering_passes(self) -> None:
        """`policyhook demo`: passes 1-2 allowed, 3-4 refused by live-sources, '5' never enters."""
        out = io.StringIO()
        rows = run_demo(out)
        assert [(r.depth, r.decision, r.rule) for r in rows] == [
            (0, "allow", "-"),
            (1, "allow", "-"),
            (2, "deny", "live-sources"),
            (2, "deny", "live-sources"),
        ]
        assert [r.claim for r in rows][-1] == "retries are capped"
        assert "never entered" in out.getvalue()
        assert "retries capped at 5" in out.getvalue()  # the unguarded run shows the failure

    def test_demo_with_remedies_keeps_the_window_in_budget(self) -> None:
        """The demo's third run: the same refusals, each remedied with a pointer in the
        window's place (two messages after every pass), archives that come back exactly,
        and no '5'."""
        out = io.StringIO()
        run_demo(out)
        assert "4 messages after pass 4" in out.getvalue()  # the refusals alone: it grew
        assert "With policyhook and remedies" in out.getvalue()
        rows = with_remedies(out := io.StringIO(), Guard())
        assert [(r.decision, r.rule, r.remedy, r.messages) for r in rows] == [
            ("allow", "-", "-", 2),
            ("allow", "-", "-", 2),
            ("deny", "live-sources", "pin", 2),
            ("deny", "grounded-numbers", "pin", 2),
        ]
        assert [r.holds.split(" ")[0] for r in rows] == [
            "summary:",
            "summary:",
            "pointer",
            "pointer",
        ]
        assert "comes back exactly" in out.getvalue()
        assert "the '5' never entered" in out.getvalue()


class TestWrapping:
    def test_callable_objects_are_named_after_their_type(self) -> None:
        """A callable instance or functools.partial (no __qualname__) is guarded, named by its type."""
        import functools

        guard = Guard()

        class Summarizer:
            def __call__(self, text: str) -> str:
                return f"a summary of {text[:8]!r}"

        def summarize(text: str, style: str) -> str:
            return f"a {style} summary of {text[:8]!r}"

        cases: list[tuple[Callable[[str], str], str]] = [
            (
                Summarizer(),
                "TestWrapping.test_callable_objects_are_named_after_their_type.<locals>.Summarizer",
            ),
            (functools.partial(summarize, style="short"), "partial"),
        ]
        for fn, name in cases:
            assert not hasattr(fn, "__qualname__")
            guarded = guard(fn)
            with capture_decisions(guard) as seen:
                assert guarded(CONFIG).startswith("a ")
            assert seen[0][1]["summarizer"]["name"] == name

    def test_async_function(self) -> None:
        """async def summarizers are awaited inside the guard and their output recorded."""
        guard = Guard()

        @guard(summarizer="async")
        async def summarize(text: str) -> str:
            await asyncio.sleep(0)
            return "an async summary of the original text"

        guard.record_source(CONFIG, "config_read")
        out = asyncio.run(summarize(CONFIG))
        assert asyncio.iscoroutinefunction(summarize)
        assert guard.check(out, summarizer="async").depth == 1

    def test_async_refusal(self) -> None:
        """An async summarizer is refused before it is awaited."""
        guard = Guard()
        ran = []

        @guard(summarizer="async")
        async def summarize(text: str) -> str:
            ran.append(text)
            return f"summary of: {text[:30]}, as a summary"

        first = asyncio.run(summarize("unregistered original content"))
        with pytest.raises(UnsafeRecompactionError):
            asyncio.run(summarize(first))
        assert len(ran) == 1

    def test_methods_sync_and_async(self) -> None:
        """Methods are wrapped with `self` skipped when finding the input."""
        guard = Guard()

        class Compactor:
            prefix = "method summary:"

            @guard(summarizer="method")
            def summarize(self, text: str) -> str:
                return f"{self.prefix} {text[:20]} (compacted)"

            @guard(summarizer="amethod")
            async def asummarize(self, text: str) -> str:
                return f"{self.prefix} async {text[:20]} (compacted)"

        guard.record_source(CONFIG, "config_read")
        c = Compactor()
        out = c.summarize(CONFIG)
        assert out.startswith("method summary:")
        assert guard.check(out, summarizer="m").depth == 1
        aout = asyncio.run(c.asummarize(text=CONFIG))
        assert guard.check(aout, summarizer="m").depth == 1
        assert Compactor.summarize.__name__ == "summarize"

    def test_summarizer_exception_propagates_and_records_nothing(self) -> None:
        """The summarizer's own exception reaches the caller unchanged; nothing is recorded."""
        store = MemoryStore()
        guard = Guard(store=store, archive_originals=True)
        boom = ValueError("model overloaded")

        @guard(summarizer="flaky")
        def summarize(text: str) -> str:
            raise boom

        with pytest.raises(ValueError) as raised:
            summarize("some original content worth keeping")
        assert raised.value is boom
        assert store.summaries("default", 10) == []
        assert store.sources(10) == []  # archive did not run either

    def test_trigger_and_budget_pressure_reach_the_policy(self) -> None:
        """policyhook.request() sets trigger/budget pressure/window for calls in its context."""
        guard = Guard()
        summarize = guard(
            lambda t: "a summary, long enough to track", summarizer="s", trigger="manual"
        )
        with capture_decisions(guard, phase="input") as seen:
            summarize("original text one")
            with policyhook.request(trigger="automatic", budget_pressure=0.8, window="w1"):
                summarize("original text two")
        assert [a["request"]["trigger"] for _, a in seen] == ["manual", "automatic"]
        assert seen[1][1]["request"]["budget_pressure"] == 0.8
        assert seen[1][1]["window"]["id"] == "w1"

    def test_each_decorator_fills_in_its_own_trigger(self) -> None:
        """Two summarizers with different default triggers, in the same request context and
        out of any: each call sees its own summarizer's trigger, the context's other fields
        unchanged (the filled-in request is made once per request, not per call)."""
        guard = Guard()
        manual = guard(lambda t: "manual summary, long enough", summarizer="m", trigger="manual")
        auto = guard(lambda t: "automatic summary, long enough", summarizer="a")
        with capture_decisions(guard, phase="input") as seen:
            for _ in range(2):
                manual("original text one")
                auto("original text two")
            with policyhook.request(budget_pressure=1, window="w2"):
                manual("original text three")
                auto("original text four")
        requests = [(a["request"]["trigger"], a["window"]["id"]) for _, a in seen]
        assert requests == [("manual", "default"), ("automatic", "default")] * 2 + [
            ("manual", "w2"),
            ("automatic", "w2"),
        ]
        pressure = seen[-1][1]["request"]["budget_pressure"]
        assert (pressure, type(pressure)) == (1.0, float)
        assert isinstance(policyhook.Request(budget_pressure=1).budget_pressure, float)

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"trigger": "sometimes"}, "trigger"),
            ({"budget_pressure": 1.5}, "budget_pressure"),
            ({"attempt": 0}, "attempt"),
        ],
    )
    def test_bad_request_fields_are_rejected(self, fields: dict[str, Any], message: str) -> None:
        """A bad trigger / budget pressure / attempt fails at once, naming the field."""
        with pytest.raises(ValueError, match=message), policyhook.request(**fields):
            pass

    def test_function_without_input_needs_an_extractor(self) -> None:
        """Guarding a function that takes no argument explains that extractor= is needed."""
        with pytest.raises(TypeError, match="extractor="):
            Guard()(lambda: "x")

    def test_a_streaming_summarizer_is_refused_when_decorated(self) -> None:
        """A generator function (sync or async, or a partial of one) returns no summary to
        record: refused when it is decorated, naming it, not granted on its first call and then
        failing; nothing is decided or recorded."""

        def stream(text: str) -> Iterator[str]:
            yield text[:10]

        async def astream(text: str) -> AsyncIterator[str]:
            yield text[:10]

        store = MemoryStore()
        guard = Guard(store=store)
        for fn, name in ((stream, "stream"), (astream, "astream"), (partial(stream), "partial")):
            with pytest.raises(TypeError, match=f"cannot guard .*{name}.*generator function"):
                guard(fn)
        assert store.since(0, 10) == (0, [])


class TestModesAndFailClosed:
    def test_audit_mode_lets_the_call_through(self, compile_policy: Any) -> None:
        """In audit mode a would-be refusal is decided as would_deny and the summarizer runs."""
        guard = Guard(compile_policy(AUDIT))
        fn, calls = counting(["first summary of the text", "second summary of the text"])
        summarize = guard(fn, summarizer="s")
        with capture_decisions(guard) as seen:
            summarize(summarize("original content here"))
        assert len(calls) == 2
        assert [d.effect for d, _ in seen] == ["allow", "would_deny"]
        assert seen[1][0].mode == "audit"

    def test_force_audit_env_shadows_enforcement(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """POLICYHOOK_FORCE_AUDIT=true turns every enforce policy into audit without file edits."""
        monkeypatch.setenv("POLICYHOOK_FORCE_AUDIT", "true")
        guard = Guard()
        summarize = guard(lambda t: "summary of unregistered content", summarizer="s")
        out = summarize("unregistered original content")
        assert summarize(out) == "summary of unregistered content"  # not refused
        assert guard.check(out, summarizer="s").effect == "would_deny"

    def test_evaluation_error_denies(self, compile_policy: Any) -> None:
        """A rule that errors at evaluation refuses (fail closed), with the reason."""
        guard = Guard(
            compile_policy("""
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata: {name: fragile}
spec:
  rules:
    - name: divides
      expression: 10 / (region.depth - region.depth) > 1
""")
        )
        with pytest.raises(UnsafeRecompactionError) as refused:
            guard.check("original text", summarizer="s", enforce=True)
        assert refused.value.rule == "divides"
        assert "could not evaluate" in refused.value.message
        assert "divide by zero" in refused.value.message.lower()

    def test_store_unreachable_fails_closed(self) -> None:
        """A store that raises makes every source dead and leaves nothing cached verified:
        summaries are refused, and so is a text cached as a source (another process may have
        recorded it as a summary since), each refusal saying the store failed."""

        class Down(MemoryStore):
            down = False

            def live(self, source_ids: Any) -> frozenset[str]:
                if self.down:
                    raise ConnectionError("store down")
                return super().live(source_ids)

        store = Down()
        guard = Guard(store=store)
        guard.record_source(CONFIG, "config_read")
        summarize = guard(lambda t: "summary resting on the config", summarizer="s")
        out = summarize(CONFIG)
        store.down = True
        for value in (out, CONFIG):
            with pytest.raises(UnsafeRecompactionError, match="live-sources") as refused:
                summarize(value)
            assert refused.value.store_failed
        store.down = False
        assert summarize(CONFIG) == "summary resting on the config"

    def test_try_record_source_goes_on_when_the_store_cannot_take_the_text(
        self, telemetry: Otel, caplog: pytest.LogCaptureFixture
    ) -> None:
        """`try_record_source` (what the adapters record the messages a summary replaces
        with): the store failing is logged without the text, counted, and None returned; the
        text is then content no store holds, so a summary made of it is refused once the
        store is back (it rests on nothing held). The store up: the source, as recorded."""
        guard = telemetry.guard()
        with store_down(guard.store), caplog.at_level("WARNING", logger="policyhook"):
            assert guard.try_record_source(CONFIG, "config_read", "cfg") is None
        assert CONFIG not in caplog.text and "store put_source failed" in caplog.text
        assert telemetry.total(STORE_ERRORS, operation="put_source") == 1
        assert guard.store.get_source("cfg") is None
        summary = guard(lambda text: "a summary of the unrecorded config", summarizer="s")(CONFIG)
        with pytest.raises(UnsafeRecompactionError, match="live-sources"):
            guard(lambda text: "never", summarizer="s")(summary)
        source = guard.try_record_source(CONFIG, "config_read", "cfg")
        assert source is not None and source.id == "cfg" and guard.store.get_source("cfg")

    def test_try_record_source_raises_the_callers_own_errors(self) -> None:
        """An id naming another text, or a text that is not a str, is the caller's mistake,
        not the store's: raised as by `record_source`, with the store up or not."""
        guard = Guard()
        guard.record_source(CONFIG, "config_read", "cfg")
        with pytest.raises(policyhook.SourceIdConflictError):
            guard.try_record_source("another text", "config_read", "cfg")
        with pytest.raises(TypeError):
            guard.try_record_source(b"bytes", "config_read")  # type: ignore[arg-type]

    def test_archive_originals_keeps_unregistered_content_live(self) -> None:
        """archive_originals=True stores unrecognised originals, so their summaries stay derivable."""
        guard = Guard(archive_originals=True)
        summarize = guard(lambda t: f"summary #{len(t)} of the content so far", summarizer="s")
        out = summarize("an original transcript no one registered")
        assert summarize(out).startswith("summary #")  # allowed: sources are live

    def test_archive_originals_archives_after_the_grant_not_before_the_decision(self) -> None:
        """Unregistered content is dead when the call is decided, archived or not: a summary
        of "summary + an unregistered turn" is refused (docs/adapters.md: register the turns);
        registered, the same input is allowed."""
        guard = Guard(archive_originals=True)
        summarize = guard(lambda t: f"summary #{len(t)} of the content so far", summarizer="s")
        out = summarize("an original transcript no one registered")
        turn = "a new turn, the user asking for the deploy's status"
        with pytest.raises(UnsafeRecompactionError, match="1 of 2 sources gone") as refused:
            summarize([out, turn])
        assert refused.value.dead_sources[0].startswith("window:")
        assert all(turn != text for _, text in guard.store.sources(10))  # nothing archived
        guard.record_source(turn, "user_turn")
        assert summarize([out, turn]).startswith("summary #")

    def test_error_message_tells_what_and_why(self) -> None:
        """str(UnsafeRecompactionError) names the region, depth, dead sources, policy and rule."""
        guard = Guard()
        summarize = guard(lambda t: "a summary of something unregistered", summarizer="s")
        out = summarize("something unregistered and original")
        with pytest.raises(UnsafeRecompactionError) as refused:
            summarize(out)
        text = str(refused.value)
        assert isinstance(refused.value, RuntimeError)
        for part in (
            "refused to summarize region",
            "depth 1",
            "window:",
            "'default'",
            "'live-sources'",
            refused.value.decision_id,
        ):
            assert part in text


class TestConcurrency:
    @pytest.fixture
    def eager_switching(self) -> Iterator[None]:
        """Switch threads as often as the interpreter allows, to expose races."""
        before = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        yield
        sys.setswitchinterval(before)

    def test_threads_get_their_own_correct_decisions(self, eager_switching: None) -> None:
        """Eight threads deciding at once each get the decision their own input calls for."""
        guard = Guard()
        guard.record_source(CONFIG, "config_read", "cfg")
        live_summary = guard(lambda t: "summary that rests on the live config", summarizer="s")(
            CONFIG
        )
        dead_summary = guard(lambda t: "summary that rests on nothing stored", summarizer="s")(
            "unregistered"
        )
        wrong: list[str] = []

        def work(n: int) -> None:
            for i in range(40):
                value, expected = (live_summary, "allow") if (n + i) % 2 else (dead_summary, "deny")
                effect = guard.check(value, summarizer="s").effect
                if effect != expected:
                    wrong.append(f"{n}/{i}: {effect} != {expected}")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []


def _request_accepted(fields: dict[str, Any]) -> bool:
    """The documented rules for `policyhook.Request`, field by field (the oracle)."""

    def within(value: Any, low: int) -> bool:
        return type(value) is not bool and isinstance(value, int) and low <= value <= 2**63 - 1

    pressure = fields.get("budget_pressure", 0.0)
    window = fields.get("window", "default")
    return (
        fields.get("trigger") in (None, "automatic", "manual")
        and type(pressure) is not bool
        and isinstance(pressure, int | float)
        and 0.0 <= pressure <= 1.0
        and within(fields.get("attempt", 1), 1)
        and within(fields.get("window_tokens", 0), 0)
        and within(fields.get("window_budget", 0), 0)
        and isinstance(window, str)
        and window != ""
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in window)
    )


_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, 1, 2**63 - 1, 2**63, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["automatic", "manual", "", "w", "session-\ud83d", "sometimes"]),
    st.text(max_size=8),
)


#: Each field valid or any value at all (so most examples are one bad field from valid).
_REQUEST_FIELDS = {
    name: st.one_of(valid, _ANY_VALUE)
    for name, valid in {
        "trigger": st.sampled_from([None, "automatic", "manual"]),
        "budget_pressure": st.one_of(st.floats(0.0, 1.0), st.sampled_from([0, 1])),
        "attempt": st.integers(1, 2**63 - 1),
        "window": st.text(min_size=1, max_size=8),
        "window_tokens": st.integers(0, 2**63 - 1),
        "window_budget": st.integers(0, 2**63 - 1),
    }.items()
}


class TestRequest:
    @deep.scaled(settings(max_examples=400, deadline=None))
    @given(st.fixed_dictionaries({}, optional=_REQUEST_FIELDS))
    @example({"window": ""})  # the edges of each field, always tried
    @example({"attempt": 0, "window_tokens": 2**63 - 1})
    @example({"window_budget": -1, "window": "w"})
    @example({"budget_pressure": float("nan")})
    @example({"attempt": 2**63})
    @example({"window_budget": 2**64, "trigger": "manual"})
    @example({"budget_pressure": 1})
    def test_a_request_is_accepted_exactly_when_every_field_is_valid(
        self, fields: dict[str, Any]
    ) -> None:
        """Any mix of types and values: `Request(...)` accepts exactly what the documented rules
        accept (its one-expression check of the usual values never lets another through), and
        an accepted pressure is a float."""
        try:
            made = policyhook.Request(**fields)
        except ValueError:
            assert not _request_accepted(fields)
        else:
            assert _request_accepted(fields)
            assert type(made.budget_pressure) is float

    def test_a_request_block_is_also_a_decorator(self) -> None:
        """`@policyhook.request(...)` puts the request in force for each call of the function,
        and restores the enclosing one after it, as the `with` block does."""

        @policyhook.request(window="decorated", budget_pressure=0.5)
        def inside() -> policyhook.Request:
            return policyhook.current_request()

        with policyhook.request(trigger="manual"):
            assert (inside().window, inside().trigger) == ("decorated", "manual")
            assert policyhook.current_request().window == "default"
        assert policyhook.current_request() == policyhook.Request()

    def test_one_block_entered_again_inside_itself_restores_each_level(self) -> None:
        """The same block entered twice, nested, leaves each level's request in force on exit."""
        block = policyhook.request(window="outer")
        with block as first:
            with policyhook.request(attempt=2), block as second:
                assert (second.window, second.attempt) == ("outer", 2)
            assert policyhook.current_request() is first
        assert policyhook.current_request() == policyhook.Request()

    def test_fields_are_merged_and_checked_when_the_block_is_entered(self) -> None:
        """A block made outside another takes the enclosing request where it is entered; a bad
        field fails there, and the enclosing request stays in force."""
        block = policyhook.request(attempt=3)
        with policyhook.request(window="entered"):
            with block as current:
                assert (current.window, current.attempt) == ("entered", 3)
            bad = policyhook.request(budget_pressure=2.0)
            with pytest.raises(ValueError, match="budget_pressure"), bad:
                pass
            assert policyhook.current_request().window == "entered"

    def test_threads_see_only_their_own_request(self) -> None:
        """A request in force in one thread is not seen by another."""
        seen: list[str] = []
        ready, done = threading.Event(), threading.Event()

        def other() -> None:
            ready.wait(5)
            seen.append(policyhook.current_request().window)
            done.set()

        thread = threading.Thread(target=other)
        thread.start()
        with policyhook.request(window="main-only"):
            ready.set()
            done.wait(5)
        thread.join()
        assert seen == ["default"]


def test_from_path_loads_the_policy_folder() -> None:
    """Guard.from_path('policies/') decides with the files in that folder."""
    guard = Guard.from_path(Path(__file__).parent.parent / "policies", reload_interval=0)
    try:
        assert "default" in [p.name for p in guard.policies.policies]
    finally:
        guard.close()


class TestGuardingSeam:
    """`guard.guarding(...)`: the public seam the decorator and every adapter are built on."""

    def test_a_granted_block_records_its_output_as_a_summary(self) -> None:
        """The block runs on a grant; `record` returns the output and later recognises it."""
        guard = Guard()
        guard.record_source(CONFIG, "config_read", "cfg-7")
        with guard.guarding([CONFIG], summarizer="mine") as call:
            assert call.decision.effect == "allow" and call.region.depth == 0
            summary = call.record("S1: retry ceiling is 7 (from config)")
        assert summary == "S1: retry ceiling is 7 (from config)"
        assert guard.provenance(summary).depth == 1
        assert guard.provenance(summary).sources == frozenset({"cfg-7"})

    def test_a_refusal_raises_on_entry_and_the_block_never_runs(self) -> None:
        """Enforce-mode deny raises before the block; nothing is recorded."""
        guard = Guard()
        guard.record_source(CONFIG, "config_read", "cfg-7")
        with guard.guarding(CONFIG, summarizer="mine") as call:
            s1 = call.record("S1: retry ceiling is 7 (from config)")
        guard.store.evict("cfg-7")
        ran = []
        with pytest.raises(UnsafeRecompactionError) as refused, guard.guarding(s1, summarizer="x"):
            ran.append(True)
        assert ran == [] and refused.value.decision.effect == "deny"
        assert "cfg-7" in refused.value.decision.dead_sources

    def test_async_code_awaits_inside_the_block(self) -> None:
        """One context manager serves async code: the awaited output is recorded."""
        guard = Guard()

        async def produce() -> str:
            await asyncio.sleep(0)
            return "an async summary of the turn"

        async def main() -> str:
            with guard.guarding("an original turn", summarizer="async-seam") as call:
                return call.record(await produce())

        out = asyncio.run(main())
        assert guard.provenance(out).depth == 1

    def test_the_request_comes_from_the_argument_or_the_context(self) -> None:
        """`request=` wins; without it the enclosing `policyhook.request(...)` is used."""
        guard = Guard()
        with capture_decisions(guard, phase="input") as seen, policyhook.request(window="w-ctx"):
            assert policyhook.current_request().window == "w-ctx"
            with guard.guarding("turn one", summarizer="s") as call:
                call.record("summary one of the first turn")
            explicit = policyhook.Request(window="w-arg", trigger="manual")
            with guard.guarding("turn two", summarizer="s", request=explicit) as call:
                call.record("summary two of the second turn")
        assert policyhook.current_request() == policyhook.Request()
        windows = [(a["window"]["id"], a["request"]["trigger"]) for _, a in seen]
        assert windows == [("w-ctx", "automatic"), ("w-arg", "manual")]
        assert guard.provenance("summary two of the second turn", "w-arg").depth == 1

    def test_recording_twice_is_an_error(self) -> None:
        """A call has one output: a second `record` raises instead of recording twice."""
        guard = Guard()
        with guard.guarding("an original turn", summarizer="s") as call:
            call.record("one summary of the turn")
            with pytest.raises(RuntimeError, match="already recorded"):
                call.record("another summary of the turn")

    def test_an_exception_in_the_block_records_nothing(self, tmp_path: Path) -> None:
        """The block's exception propagates unchanged; the log says the call failed."""
        guard = Guard(decision_log=tmp_path / "log.jsonl")
        with pytest.raises(KeyError), guard.guarding("an original turn", summarizer="s"):
            raise KeyError("model down")
        with guard.guarding("an original turn", summarizer="s"):
            pass  # granted, but the caller never recorded an output
        guard.check("an original turn", summarizer="s")
        guard.close()
        records = [r for _, r in policyhook.decisionlog.read(tmp_path / "log.jsonl")]
        assert [r["outcome"] for r in records] == ["failed", "unrecorded", "checked"]

    def test_an_exception_after_recording_ends_the_call_failed(self, tmp_path: Path) -> None:
        """The block raised after `call.record`: the exception propagates unchanged and the call
        ends `failed` (not `summarized`); a KeyboardInterrupt there ends it `cancelled`."""
        guard = Guard(decision_log=tmp_path / "log.jsonl")
        for error in (ValueError("caller bug"), KeyboardInterrupt()):
            with (
                pytest.raises(type(error)) as raised,
                guard.guarding("an original turn", summarizer="s") as call,
            ):
                call.record("a summary of the original turn")
                raise error
            assert raised.value is error
        guard.close()
        records = [r for _, r in policyhook.decisionlog.read(tmp_path / "log.jsonl")]
        assert [r["outcome"] for r in records] == ["failed", "cancelled"]

    def test_the_request_is_read_when_the_block_is_entered(self) -> None:
        """`guarding(...)` made outside a `policyhook.request` block and entered inside it
        decides with that block's request (as when the body ran on entering)."""
        guard = Guard()
        seen: list[dict[str, Any]] = []
        guard.add_listener(lambda decision, activation: seen.append(dict(activation)))
        guarded = guard.guarding("an original turn", summarizer="s")
        with policyhook.request(window="entered"), guarded as call:
            call.record("a summary of the original turn")
        assert seen[0]["window"]["id"] == "entered"

    def test_reload_puts_edited_policies_in_force_now(self, tmp_path: Path) -> None:
        """`guard.reload()` re-reads the files; a guard without files has nothing to reload."""
        (tmp_path / "p.yaml").write_text(AUDIT)
        guard = Guard.from_path(tmp_path, reload_interval=0)
        assert not guard.reload()
        (tmp_path / "p.yaml").write_text(AUDIT.replace("shadow", "shadow-2"))
        assert guard.reload()
        assert guard.policies.policies[0].name == "shadow-2"
        assert not Guard().reload()
        guard.close()

    def test_adapters_use_only_the_public_api(self) -> None:
        """LangChain and langmem adapters touch no private policyhook name and no `.ledger`."""
        import ast

        for name in ("langchain", "langmem"):
            path = Path(policyhook.__file__).parent / "adapters" / f"{name}.py"
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "policyhook"
                ):
                    assert not any(a.name.startswith("_") for a in node.names), (name, node.lineno)
                    assert not any(p.startswith("_") for p in (node.module or "").split("."))
                if isinstance(node, ast.Attribute) and _names_guard(node.value):
                    assert not node.attr.startswith("_"), (name, node.lineno)
                    assert node.attr != "ledger", (name, node.lineno)


def _names_guard(node: Any) -> bool:
    """`guard` or `self.guard`: the adapter's Guard."""
    import ast

    return (isinstance(node, ast.Name) and node.id == "guard") or (
        isinstance(node, ast.Attribute) and node.attr == "guard"
    )
