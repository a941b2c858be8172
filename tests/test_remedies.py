"""Remedies: the way forward after a refusal (rederive, offload, pin, escalate)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import deep
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outage import store_down
from test_telemetry import Otel
from test_telemetry import telemetry as telemetry  # the fixture

import policyhook
import policyhook._activation
from policyhook import Region, remedies
from policyhook._telemetry import REMEDIES, REMEDY_SPAN_NAME, STORE_ERRORS
from policyhook.remedies import Escalation


class TestChunks:
    @deep.scaled(settings(max_examples=200, deadline=None, derandomize=True))
    @given(st.lists(st.text(max_size=40), max_size=30), st.integers(1, 120))
    def test_groups_keep_order_never_cut_and_fit_the_budget(
        self, texts: list[str], budget: int
    ) -> None:
        """Chunks hold every text once, in order, uncut; a group over budget is a lone text."""
        groups = remedies.chunks(texts, budget)
        assert [t for g in groups for t in g] == texts
        for group in groups:
            assert group
            assert len(group) == 1 or sum(len(t) for t in group) <= budget

    def test_no_budget_is_one_group_and_a_bad_budget_is_an_error(self) -> None:
        """Without a budget everything is one chunk; a budget below 1 names the parameter."""
        assert remedies.chunks(["a", "b"], None) == [["a", "b"]]
        assert remedies.chunks([], None) == []
        with pytest.raises(ValueError, match='"budget_chars" must be >= 1: 0'):
            remedies.chunks(["a"], 0)

    def test_merge_places_chunk_summaries_side_by_side(self) -> None:
        """Merging concatenates (never re-summarizes) and drops empty chunk summaries."""
        assert remedies.merge(["one ", "", "two"]) == "one\n\ntwo"


class TestOffloadPayload:
    @deep.scaled(settings(max_examples=100, deadline=None, derandomize=True))
    @given(st.lists(st.text()))
    def test_archive_round_trips_exactly(self, texts: list[str]) -> None:
        """Whatever texts are archived come back identical, in order."""
        assert remedies.unarchive(remedies.archive_payload(texts), "r") == texts

    @pytest.mark.parametrize("payload", ["not json", '{"a": 1}', "[1, 2]"])
    def test_a_foreign_entry_is_a_clear_error(self, payload: str) -> None:
        """An entry that is not an offloaded region names the ref."""
        with pytest.raises(ValueError, match="store entry 'offload:x' is not an offloaded region"):
            remedies.unarchive(payload, "offload:x")

    def test_pointer_says_what_how_much_and_how_to_get_it_back(self) -> None:
        """The pointer names the ref, the count and size, the retrieval path, and pinned facts."""
        pinned = (remedies.Pinned("number", "retry_ceiling", "7", "cfg-42"),)
        text = remedies.pointer_text("offload:ab12", ["x" * 10, "y" * 5], pinned)
        assert "offload:ab12" in text and "2 earlier message(s), 15 characters" in text
        assert "retrieve_context" in text and "guard.retrieve('offload:ab12')" in text
        assert "- retry_ceiling: 7 [cfg-42]" in text


def hanging(release: threading.Event) -> remedies.Handler:
    """A handler that gives no answer until `release` is set (then none either)."""

    def handler(refusal: object) -> str | None:
        release.wait()
        return None

    return handler


class TestEscalation:
    def test_an_answer_is_returned(self) -> None:
        """A handler's answer comes back with no reason."""
        assert Escalation(lambda r: "offload", timeout=1).ask(object()) == ("offload", "")

    def test_a_handler_that_never_answers_is_bounded(self) -> None:
        """A hanging handler costs at most timeout x attempts, then there is no answer."""
        release = threading.Event()
        started = time.monotonic()
        answer, reason = Escalation(hanging(release), timeout=0.05, attempts=2).ask(None)
        release.set()
        assert answer is None and "attempt 2: no answer within 0.05s" in reason
        assert time.monotonic() - started < 5

    def test_raising_and_declining_handlers_are_no_answer(self) -> None:
        """A handler that raises, or answers None, is tried again, then reported."""
        calls: list[int] = []

        def flaky(refusal: object) -> str | None:
            calls.append(1)
            raise RuntimeError("pager down")

        answer, reason = Escalation(flaky, timeout=1, attempts=3).ask(None)
        assert answer is None and len(calls) == 3 and "pager down" in reason
        assert Escalation(lambda r: None, timeout=1).ask(None) == (
            None,
            "escalation attempt 1: handler declined",
        )

    def test_async_handlers_and_async_callers(self) -> None:
        """An async handler is awaited with the timeout; a sync one never blocks the loop."""

        async def slow(refusal: object) -> str:
            await asyncio.sleep(10)
            return "late"

        async def quick(refusal: object) -> str:
            return "rederive"

        async def main() -> None:
            assert await Escalation(quick, timeout=1).aask(None) == ("rederive", "")
            answer, reason = await Escalation(slow, timeout=0.05).aask(None)
            assert answer is None and "no answer within" in reason
            release = threading.Event()
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                for _ in range(5):
                    await asyncio.sleep(0.005)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            answer, _ = await Escalation(hanging(release), timeout=0.2).aask(None)
            release.set()
            await ticker
            assert answer is None and ticks == 5  # the loop ran while the handler hung

        asyncio.run(main())
        assert Escalation(quick, timeout=1).ask(None) == ("rederive", "")

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"timeout": 0}, '"timeout" must be > 0 seconds: 0'),
            ({"attempts": 0}, '"attempts" must be >= 1: 0'),
            ({"fallback": "escalate"}, '"fallback" must not be escalate'),
            ({"fallback": "shred"}, '"fallback" must be one of rederive, offload, pin, escalate'),
        ],
    )
    def test_bad_bounds_are_refused(self, options: dict[str, object], message: str) -> None:
        """Unbounded or looping escalations cannot be configured."""
        with pytest.raises(ValueError, match=message):
            Escalation(lambda r: None, **options)  # type: ignore[arg-type]


POLICY = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata: {{name: p}}
spec:
  rules:
    - name: live
      expression: size(region.dead_sources) == 0
      remedy: offload
      remedyExpression: >-
        size(region.live_sources) > 0 && request.trigger == "manual" ? "escalate" : "{named}"
"""


def activation(live: int, dead: int, trigger: str = "automatic") -> Mapping[str, Any]:
    return policyhook._activation.build(
        Region("r", depth=1, sources=frozenset(f"s{i}" for i in range(live + dead))),
        frozenset(f"s{i}" for i in range(live)),
        trigger=trigger,
        budget_pressure=0.9,
        attempt=1,
        window_id="w",
        window_tokens=0,
        window_budget=0,
        window_max_depth=1,
        summarizer="s",
        lossless=False,
        idempotent=False,
        tokens=None,
    )


class TestPolicyRemedy:
    def test_the_refusing_rule_names_the_remedy(self, compile_policy: Callable[..., Any]) -> None:
        """remedyExpression picks the remedy per call; a non-remedy value falls back to `remedy`."""
        policies = compile_policy(POLICY.format(named="pin"))
        assert policies.decide(activation(1, 1)).remedy == "pin"
        assert policies.decide(activation(1, 1, "manual")).remedy == "escalate"
        assert policies.decide(activation(1, 0)).remedy == ""  # allowed: nothing to remedy
        fallback = compile_policy(POLICY.format(named="shred"))
        assert fallback.decide(activation(1, 1)).remedy == "offload"

    def test_the_refusal_carries_it(self, compile_policy: Callable[..., Any]) -> None:
        """UnsafeRecompactionError.remedy is the deciding rule's remedy."""
        decision = compile_policy(POLICY.format(named="rederive")).decide(activation(0, 2))
        assert policyhook.UnsafeRecompactionError(decision).remedy == "rederive"

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            (
                "remedy: shred",
                "spec.rules[0].remedy must be one of rederive, offload, pin, escalate",
            ),
            ("remedyExpression: region.depth", "remedyExpression"),
        ],
    )
    def test_a_bad_remedy_fails_at_load(
        self, compile_policy: Callable[..., Any], line: str, message: str
    ) -> None:
        """An unknown remedy or a non-string remedyExpression is a load error naming the rule."""
        text = POLICY.format(named="pin").split("      remedy: offload")[0] + f"      {line}\n"
        with pytest.raises(policyhook.PolicyError, match=re.escape(message)) as caught:
            compile_policy(text)
        assert "policy.yaml:" in str(caught.value) and "'live'" in str(caught.value)


# -- through the guard --------------------------------------------------------------------------

CONFIG = "config/agent.yaml: retry_ceiling: 7  # max retries for flaky tool calls"
TURNS = [
    "user: the deploy step keeps timing out, please keep retrying it",
    "tool(deploy): timeout after 30s (attempt 1), see /var/log/deploy.log",
    "user: also make sure the notification goes to #ops, ticket OPS-4821",
]


class Scripted:
    """A stand-in summarizer: records what it was given, returns a numbered summary."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []

    def __call__(self, texts: list[str]) -> str:
        self.inputs.append(list(texts))
        return f"Summary {len(self.inputs)}: deploy retried; retry ceiling from config."


def seeded(guard: policyhook.Guard, summarize: Callable[[list[str]], str]) -> str:
    """Sources recorded, one granted pass: a depth-1 summary resting on them."""
    guard.record_source(CONFIG, kind="config_read", source_id="cfg-42")
    for turn in TURNS:
        guard.record_source(turn, kind="user_turn")
    return summarize([CONFIG, *TURNS])


class TestDecoratorRemedy:
    def test_pin_archives_the_region_and_keeps_exact_facts(self) -> None:
        """The default refusal (dead source) returns a pointer with pinned facts, not an error."""
        guard = policyhook.Guard()
        inner = Scripted()
        summarize = guard(inner, summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        window = [s1, "user: status?"]
        text = summarize(window)
        assert len(inner.inputs) == 1  # the refused summary was never summarized again
        assert text.startswith(remedies.POINTER_PREFIX)
        (ref,) = remedies.pointers(text)
        assert guard.retrieve(ref) == window  # lossless
        assert "/var/log/deploy.log [" in text and "OPS-4821 [" in text  # live facts pinned
        assert "cfg-42" not in text  # the dead source states nothing any more
        # The pointer is original evidence resting on the archive: the next pass may go on.
        assert guard.provenance(text).depth == 0
        assert summarize([text, "user: next"]).startswith("Summary 2")

    def test_rederive_summarizes_the_live_originals_instead(self) -> None:
        """strict's depth ceiling re-derives from originals: depth 1 again, never depth 3."""
        guard = policyhook.Guard(policyhook.load("policies/strict"))
        inner = Scripted()
        summarize = guard(inner, summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        s2 = summarize([s1])
        assert guard.provenance(s2).depth == 2
        s3 = summarize([s2])  # depth 2 automatic: refused, re-derived
        assert inner.inputs[-1] == [CONFIG, *TURNS]  # the originals, oldest first
        region = guard.provenance(s3)
        assert region.depth == 1 and "cfg-42" in region.sources

    def test_rederive_chunks_originals_over_budget_and_merges_side_by_side(self) -> None:
        """Originals larger than budget_chars are summarized in chunks, concatenated."""
        guard = policyhook.Guard(policyhook.load("policies/strict"))
        inner = Scripted()
        summarize = guard(inner, summarizer="s", remedy=True, budget_chars=150)
        s2 = summarize([seeded(guard, summarize)])
        calls = len(inner.inputs)
        s3 = summarize([s2])
        chunks = inner.inputs[calls:]
        assert len(chunks) > 1 and [t for c in chunks for t in c] == [CONFIG, *TURNS]
        assert s3.count("Summary") == len(chunks)
        assert guard.provenance(s3).depth == 1

    def test_rederive_with_dead_sources_falls_back_to_pin(self) -> None:
        """Nothing can be re-derived from a dead source: pin runs instead, and says why."""
        guard = policyhook.Guard(policyhook.load("policies/strict"))
        refusal = _refusal(guard, "rederive")
        result = guard.remedy(refusal, ["a summary no store can back"], summarize=Scripted())
        assert (result.requested, result.remedy) == ("rederive", "pin")
        assert "gone from the store" in result.reason and result.fell_back

    def test_a_store_that_cannot_archive_leaves_the_refusal_standing(self) -> None:
        """When even pin cannot archive, the refusal is raised: the caller keeps its window."""

        class Full(policyhook.MemoryStore):
            def put_source(self, source: policyhook.Source, text: str) -> None:
                if source.id.startswith("offload:"):
                    raise OSError("disk full")
                super().put_source(source, text)

        guard = policyhook.Guard(store=Full())
        summarize = guard(Scripted(), summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        with pytest.raises(policyhook.UnsafeRecompactionError) as caught:
            summarize([s1])
        assert isinstance(caught.value.__cause__, OSError)

    def test_a_store_down_leaves_the_refusal_standing_wherever_it_fails(self) -> None:
        """The store down while the remedy reads what it needs (the region's sources, their
        put order) as well as when it archives: the refusal is raised again, the same one,
        never the store's error (an adapter catching refusals keeps its window)."""
        guard = policyhook.Guard()
        summarize = guard(Scripted(), summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        with store_down(guard.store), pytest.raises(policyhook.UnsafeRecompactionError) as caught:
            summarize([s1])
        assert isinstance(caught.value.__cause__, ConnectionError)
        assert caught.value.rule == "live-sources"

    def test_sources_that_cannot_be_read_back_still_leave_a_pin(self, telemetry: Otel) -> None:
        """Only the reads failing (a replica gone, the writes still taken): no live source to
        pin facts from, but the input is archived exactly behind the pointer, and counted."""
        guard = telemetry.guard()
        summarize = guard(Scripted(), summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        window = [s1, "user: status?"]
        with store_down(guard.store, ["get_sources", "sources"]):
            text = summarize(window)
        assert text.startswith(remedies.POINTER_PREFIX)
        assert "OPS-4821 [" not in text  # no live source read: no fact pinned
        (ref,) = remedies.pointers(text)
        assert guard.retrieve(ref) == window  # lossless all the same
        assert telemetry.total(STORE_ERRORS, operation="get_sources") == 1
        (span,) = telemetry.spans(REMEDY_SPAN_NAME)
        assert span.attributes is not None
        assert span.attributes["policyhook.store.error"] == "get_sources"

    def test_async_summarizers_get_the_same_remedies(self) -> None:
        """An async guarded summarizer with remedy=True returns the remedy's text too."""
        guard = policyhook.Guard()
        inner = Scripted()

        @guard(summarizer="s", remedy=True)
        async def summarize(texts: list[str]) -> str:
            return inner(texts)

        async def main() -> str:
            guard.record_source(CONFIG, kind="config_read", source_id="cfg-42")
            s1 = await summarize([CONFIG])
            guard.store.evict("cfg-42")
            return await summarize([s1])

        assert asyncio.run(main()).startswith(remedies.POINTER_PREFIX)

    def test_retrieving_an_unknown_ref_names_it(self) -> None:
        """guard.retrieve of a ref the store does not hold is a KeyError naming it."""
        with pytest.raises(KeyError, match="offload:nope"):
            policyhook.Guard().retrieve("offload:nope")


def _refusal(guard: policyhook.Guard, remedy: str) -> policyhook.UnsafeRecompactionError:
    decision = guard.check(["a summary no store can back"], summarizer="s")
    return policyhook.UnsafeRecompactionError(dataclasses.replace(decision, remedy=remedy))


class TestEscalate:
    def test_the_handler_chooses_a_remedy_or_writes_the_text(self) -> None:
        """A handler's remedy name runs that remedy; any other answer is the window's text."""
        asked: list[object] = []

        def handler(refusal: object) -> str:
            asked.append(refusal)
            return "offload" if len(asked) == 1 else "A person's note: ceiling is 7 (cfg-42)."

        guard = policyhook.Guard(escalation=Escalation(handler, timeout=1))
        refusal = _refusal(guard, "escalate")
        first = guard.remedy(refusal, ["text"])
        assert first.remedy == "offload" and first.text.startswith(remedies.POINTER_PREFIX)
        second = guard.remedy(refusal, ["text"])
        assert second.remedy == "escalate" and second.text.startswith("A person's note")
        assert asked == [refusal, refusal]

    def test_no_answer_in_time_runs_the_fallback(self) -> None:
        """A hanging handler is bounded; the configured fallback runs and says why."""
        release = threading.Event()
        escalation = Escalation(hanging(release), timeout=0.05, fallback="offload")
        guard = policyhook.Guard(escalation=escalation)
        result = guard.remedy(_refusal(guard, "escalate"), ["text"])
        release.set()
        assert result.remedy == "offload" and "no answer within" in result.reason

    def test_without_a_handler_escalate_falls_back_to_pin(self) -> None:
        """escalate with no handler configured pins, and says so."""
        guard = policyhook.Guard()
        result = guard.remedy(_refusal(guard, "escalate"), ["text"])
        assert result.remedy == "pin" and result.reason == "no escalation handler is configured"


class TestRemedyTelemetry:
    def test_span_and_counter_for_every_remedy(self, telemetry: Otel) -> None:
        """Each remedy is one policyhook.remedy span and one policyhook.remedies point."""
        guard = telemetry.guard()
        summarize = guard(Scripted(), summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        summarize([s1])
        guard.remedy(_refusal(guard, "rederive"), ["x"])
        (first, second) = telemetry.spans(REMEDY_SPAN_NAME)
        assert first.attributes is not None and second.attributes is not None
        assert first.attributes["policyhook.remedy"] == "pin"
        assert first.attributes["policyhook.remedy.outcome"] == "applied"
        assert str(first.attributes["policyhook.remedy.ref"]).startswith("offload:")
        assert second.attributes["policyhook.remedy.requested"] == "rederive"
        assert second.attributes["policyhook.remedy.outcome"] == "fallback"
        assert telemetry.total(REMEDIES, remedy="pin", outcome="applied") == 1
        assert telemetry.total(REMEDIES, remedy="pin", requested="rederive") == 1


class TestCarriedPointers:
    def test_a_summary_that_drops_a_pointer_gets_it_back_verbatim(self) -> None:
        """A granted summary of a window holding a pointer keeps the pointer and its pins."""
        guard = policyhook.Guard()
        inner = Scripted()
        summarize = guard(inner, summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        pointer = summarize([s1, "user: status?"])
        later = summarize([pointer, "user: next step, please"])
        assert later.startswith("Summary 2") and later.endswith(pointer)
        (ref,) = remedies.pointers(later)
        assert guard.retrieve(ref)[0] == s1
        assert guard.provenance(later).depth == 1  # the carried pointer is part of the record

    def test_a_pointer_in_a_regions_text_is_carried_too(self) -> None:
        """An explicit Region whose text holds a pointer: the granted summary gets the pointer
        back, and the caller gets its output (reading the input again for it raised TypeError
        on the Region after the summarizer had run)."""
        guard = policyhook.Guard()
        summarize = guard(Scripted(), summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        guard.store.evict("cfg-42")
        pointer = summarize([s1, "user: status?"])
        window: list[Any] = [policyhook.Region.original(pointer), "user: next step, please"]
        later = summarize(window)
        assert later.startswith("Summary") and later.endswith(pointer)
        assert remedies.pointers(later) == remedies.pointers(pointer)

    def test_only_lost_pointers_are_added(self) -> None:
        """Pointers the output kept are not repeated; inputs without pointers change nothing."""
        pinned = (remedies.Pinned("path", "", "/etc/app.yaml", "src-1"),)
        block = remedies.pointer_text("offload:ab12", ["x"], pinned)
        assert remedies.carried(["no pointer here"], "out") == "out"
        assert remedies.carried([f"before\n{block}\nafter"], "out") == f"out\n\n{block}"
        assert remedies.carried([block, block], f"out {block}") == f"out {block}"


#: Texts stating facts of every pinned kind, as sources do.
FACT_TEXTS = (
    CONFIG,
    "deploy v2.3.1 to /srv/app, runbook https://wiki.example.com/deploy and ticket JIRA-123",
    "timeout_ms = 30000 on host build-7 (commit 3f9a2c1e5b7d), started 2026-11-30",
)


class TestPinnedFacts:
    """What `pin` carries is what a reader re-uses: each keyed value, its key as written."""

    def test_a_number_is_pinned_with_its_key_as_written(self) -> None:
        text = (
            'config/agent.yaml: retry_ceiling: 7\nmax connections = 100\n{"timeout_s": 30}\n'
            "self.backoff_ms = 250"
        )
        assert [str(p) for p in remedies.pin([("cfg", text)]) if p.kind == "number"] == [
            "retry_ceiling: 7 [cfg]",
            "max connections: 100 [cfg]",
            "timeout_s: 30 [cfg]",
            "self.backoff_ms: 250 [cfg]",
        ]

    def test_two_keys_with_one_value_are_both_pinned(self) -> None:
        """`workers: 7` beside `retry_ceiling: 7` is another fact, not the same 7."""
        pinned = remedies.pin([("cfg", '{"retry_ceiling": 7, "workers": 7}')])
        assert [(p.key, p.value) for p in pinned] == [("retry_ceiling", "7"), ("workers", "7")]

    def test_a_key_is_not_pinned_again_as_an_identifier(self) -> None:
        pinned = remedies.pin([("cfg", "retry_ceiling: 7 applies to fetch_invoices only")])
        assert [p.value for p in pinned if p.kind == "identifier"] == ["fetch_invoices"]


class TestPinThroughPointers:
    """A region offloaded again holds an earlier pointer: its pinned facts go on, each with the
    source it came from, and the pointer's own wording (ref, tool name) pins nothing."""

    def pointer(self, pinned: tuple[remedies.Pinned, ...], ref: str = "offload:0123abcd") -> str:
        return remedies.pointer_text(ref, ["archived", "texts"], pinned)

    def test_a_pointer_hands_on_its_facts_with_their_sources(self) -> None:
        pinned = remedies.pin([(f"src-{i}", text) for i, text in enumerate(FACT_TEXTS)])
        assert {p.source_id for p in pinned} == {"src-0", "src-1", "src-2"}
        again = remedies.pin([("pointer-1", self.pointer(pinned))])
        assert again == pinned
        assert not any(p.value in ("0123abcd", "retrieve_context") for p in again)

    def test_a_pointer_inside_a_longer_text_and_the_text_s_own_facts(self) -> None:
        """A summary carrying a pointer (`carried`): its own facts are its own."""
        pinned = remedies.pin([("cfg", CONFIG)])
        text = "Summary: deployed v4.5.6 to /opt/new.\n\n" + self.pointer(pinned)
        got = {(p.value, p.source_id) for p in remedies.pin([("summary-1", text)])}
        assert {("7", "cfg"), ("v4.5.6", "summary-1"), ("/opt/new", "summary-1")} <= got
        assert all(source in ("cfg", "summary-1") for _, source in got)

    def test_a_list_after_a_pointer_without_facts_is_the_text_s_own(self) -> None:
        """Only a pointer's "Exact facts" lines are its own: a list written after a pointer
        that pinned nothing is the text's, not facts of bogus sources."""
        text = self.pointer(()) + "\n- rolled back to v1.0.2 [done]"
        assert remedies.without_pointers(text).endswith("- rolled back to v1.0.2 [done]")
        assert [(p.value, p.source_id) for p in remedies.pin([("turn-9", text)])] == [
            ("v1.0.2", "turn-9")
        ]

    @settings(deep.scaled(settings(max_examples=200, deadline=None, derandomize=True)))
    @given(
        facts=st.lists(
            st.tuples(
                st.sampled_from(
                    [
                        "retry_ceiling: {n}",
                        "max connections = {n}",
                        "release v{n}.2.{n}",
                        "logs in /var/log/app-{n}.log",
                        "see https://ci.example.org/build/{n}",
                        "ticket OPS-{n}",
                        "on 2026-10-{d}",
                        "flag use_cache_{n}",
                    ]
                ),
                st.integers(1, 999),
            ),
            min_size=1,
            max_size=8,
        ),
        ids=st.lists(st.text(min_size=1, max_size=12).filter(lambda s: "\n" not in s), min_size=8),
    )
    def test_pins_survive_any_number_of_pointers(
        self, facts: list[tuple[str, int]], ids: list[str]
    ) -> None:
        """Pinned, offloaded, pinned again (and again): the same facts, the same sources,
        whatever the source ids hold (brackets, spaces)."""
        texts = [
            (ids[i], template.format(n=n, d=f"{n % 28 + 1:02d}"))
            for i, (template, n) in enumerate(facts)
        ]
        pinned = remedies.pin(texts)
        assert pinned, texts
        once = remedies.pin([("pointer-1", self.pointer(pinned, "offload:aa11"))])
        twice = remedies.pin([("pointer-2", self.pointer(once, "offload:bb22"))])
        assert once == twice == pinned

    def test_offloaded_twice_the_window_keeps_the_first_facts(self) -> None:
        """Through the guard: a pointer's region refused again and pinned keeps the facts its
        pointer listed, with the config's own source id; nothing of the pointer's wording."""
        guard = policyhook.Guard()
        summarize = guard(Scripted(), summarizer="s", remedy=True)
        s1 = seeded(guard, summarize)
        first = guard.remedy(guard_refusal(guard, [s1, CONFIG]), [s1, CONFIG], summarizer="s")
        assert any(p.source_id == "cfg-42" and p.value == "7" for p in first.pinned)
        guard.record_source("user: keep going", kind="user_turn")
        window = [first.text, "user: keep going"]
        second = guard.remedy(guard_refusal(guard, window), window, summarizer="s")
        assert set(first.pinned) <= set(second.pinned)
        wording = ("retrieve_context", (first.ref or "").partition(":")[2])
        assert not any(p.value in wording for p in second.pinned)
        assert "- retry_ceiling: 7 [cfg-42]" in second.text


def guard_refusal(guard: policyhook.Guard, value: Any) -> policyhook.UnsafeRecompactionError:
    """A refusal of `value` to remedy: the guard's own decision, made a deny (the policy
    named the pin remedy), so `Guard.remedy` runs on what the guard read."""
    decision = guard.check(value, summarizer="s")
    return policyhook.UnsafeRecompactionError(
        dataclasses.replace(decision, effect=policyhook.Effect.DENY)
    )
