"""The provenance model: depth and sources over chains and merges, and recognition of summaries."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import deep
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_history import known_texts, replay

from policyhook import (
    Guard,
    MemoryStore,
    Region,
    Request,
    Source,
    SQLiteStore,
    Store,
    UnsafeRecompactionError,
    _index,
    _provenance,
)
from policyhook._index import _BATCH, _LARGE_INPUT, Index
from policyhook._provenance import Entry, Ledger
from policyhook.testing import capture_decisions

ALLOW_ALL = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata: {name: allow-all}
spec:
  rules: [{name: always, expression: "true"}]
"""


DEFAULT_LIKE = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata: {name: live-sources}
spec:
  rules:
    - name: summaries-need-live-sources
      expression: "region.depth == 0 || size(region.dead_sources) == 0"
"""


@dataclass
class Message:
    role: str
    content: object


def passes(n: int) -> list[str]:
    return [f"summary pass {i}: the retry ceiling was discussed at length ({i})" for i in range(n)]


@pytest.fixture
def guard(compile_policy) -> Guard:  # type: ignore[no-untyped-def]
    return Guard(compile_policy(ALLOW_ALL))


def decide(guard: Guard, value: object) -> dict:  # type: ignore[type-arg]
    with capture_decisions(guard) as seen:
        guard.check(value, summarizer="probe")
    return dict(seen[0][1]["region"])


class TestChains:
    def test_depth_grows_by_one_per_pass_over_six_passes(self, guard: Guard) -> None:
        """Each pass over the previous output is one deeper: 0, 1, 2, … exactly."""
        outputs = iter(passes(6))
        summarize = guard(lambda text: next(outputs), summarizer="s")
        cfg = guard.record_source("retry_ceiling: 7 read from config", kind="config_read")
        current = "retry_ceiling: 7 read from config"
        depths = []
        for _ in range(6):
            depths.append(decide(guard, current)["depth"])
            current = summarize(current)
        assert depths == [0, 1, 2, 3, 4, 5]
        final = decide(guard, current)
        assert final["depth"] == 6
        assert final["sources"] == [cfg.id]
        assert final["kind"] == "summary"

    def test_sources_accumulate_across_passes_with_new_turns(self, guard: Guard) -> None:
        """A chain that takes in a new turn each pass rests on every turn it ever saw."""
        outputs = iter(passes(5))
        summarize = guard(lambda messages: next(outputs), summarizer="s")
        ids = []
        window: list[str] = []
        for i in range(5):
            turn = f"user turn number {i}: please keep retrying the deploy"
            ids.append(guard.record_source(turn, kind="user_turn").id)
            window = [*window, turn]
            window = [summarize(window)]
        region = decide(guard, window)
        assert region["depth"] == 5
        assert region["sources"] == sorted(ids)
        assert region["source_kinds"] == ["user_turn"]

    def test_merge_takes_max_depth_and_union_of_sources(self, guard: Guard) -> None:
        """Merging a depth-3 chain with a depth-1 summary and an original gives depth 4, all sources."""
        a_out, b_out = iter(passes(3)), iter(["branch b summary: notify #ops on failure, always"])
        sa = guard(lambda t: next(a_out), summarizer="a")
        sb = guard(lambda t: next(b_out), summarizer="b")
        src_a = guard.record_source(
            "config: retry_ceiling 7 for the deploy tool", kind="config_read"
        )
        src_b = guard.record_source("tool(notify): channel #ops configured ok", kind="tool_output")
        src_c = guard.record_source("user: and keep the logs for a week please", kind="user_turn")
        chain = "config: retry_ceiling 7 for the deploy tool"
        for _ in range(3):
            chain = sa(chain)
        branch = sb("tool(notify): channel #ops configured ok")
        merged_input = [chain, branch, "user: and keep the logs for a week please"]
        region = decide(guard, merged_input)
        assert region["depth"] == 3
        assert region["sources"] == sorted([src_a.id, src_b.id, src_c.id])
        merge_out = guard(
            lambda v: "merged summary of everything so far, all three parts", summarizer="m"
        )
        merged = merge_out(merged_input)
        assert decide(guard, merged)["depth"] == 4
        assert decide(guard, merged)["sources"] == sorted([src_a.id, src_b.id, src_c.id])
        assert set(decide(guard, merged)["source_kinds"]) == {
            "config_read",
            "tool_output",
            "user_turn",
        }


class TestRecognition:
    @pytest.fixture
    def summary(self, guard: Guard) -> tuple[str, Source]:
        src = guard.record_source("config read: retry_ceiling = 7", kind="config_read")
        s = guard(lambda t: "Summary: retry ceiling is 7 (from config).", summarizer="s")
        return s("config read: retry_ceiling = 7"), src

    def test_exact_output_is_a_summary(self, guard: Guard, summary: tuple[str, Source]) -> None:
        """The exact text a guarded summarizer returned comes back as a depth-1 summary."""
        region = decide(guard, summary[0])
        assert (region["kind"], region["depth"], region["sources"]) == (
            "summary",
            1,
            [summary[1].id],
        )

    def test_list_element(self, guard: Guard, summary: tuple[str, Source]) -> None:
        """A prior summary as one string of a list is recognised."""
        assert decide(guard, ["hello there, new turn", summary[0]])["depth"] == 1

    def test_message_objects_and_dicts(self, guard: Guard, summary: tuple[str, Source]) -> None:
        """Messages with .content, with a 'content' key, or content blocks are recognised."""
        assert decide(guard, [Message("assistant", summary[0])])["depth"] == 1
        assert decide(guard, [{"role": "system", "content": summary[0]}])["depth"] == 1
        blocks = [{"role": "user", "content": [{"type": "text", "text": summary[0]}]}]
        assert decide(guard, blocks)["depth"] == 1

    def test_embedded_in_larger_string(self, guard: Guard, summary: tuple[str, Source]) -> None:
        """'Summary so far:\\n' + summary + new turns is a summary resting on its sources and the new text."""
        region = decide(guard, "Summary so far:\n" + summary[0] + "\nuser: next question here")
        assert region["depth"] == 1
        assert summary[1].id in region["sources"]
        assert any(s.startswith("window:") for s in region["sources"])  # the unregistered turns

    def test_unrecognised_text_is_original(self, guard: Guard) -> None:
        """Text no guarded summarizer produced is original content at depth 0."""
        region = decide(guard, "a brand new transcript nobody has seen")
        assert (region["kind"], region["depth"]) == ("original", 0)
        assert region["dead_sources"] == region["sources"]  # no store holds it

    def test_whitespace_around_output_does_not_hide_it(self, guard: Guard) -> None:
        """Outputs are remembered stripped, so the trailing newline an LLM adds does not matter."""
        s = guard(lambda t: "  Summary: the deploy keeps failing.\n", summarizer="s")
        out = s("original text, long enough to matter")
        assert decide(guard, out.strip())["depth"] == 1

    def test_short_text_matches_only_whole(self, guard: Guard) -> None:
        """A tiny summary ('OK') is recognised as a whole message, never inside other text."""
        s = guard(lambda t: "OK", summarizer="s")
        s("something original to summarize")
        assert decide(guard, ["OK"])["depth"] == 1
        assert decide(guard, "OK, so the user said OK twice")["depth"] == 0

    def test_explicit_region_objects(self, guard: Guard) -> None:
        """Explicit Region objects carry their own depth and sources."""
        region = Region(id="r1", depth=3, sources=frozenset({"cfg-9"}), chars=10)
        got = decide(guard, [region, Region.original("fresh text", [Source("t1", "user_turn")])])
        assert got["depth"] == 3
        assert got["sources"] == ["cfg-9", "t1"]

    def test_extractor_for_other_signatures(self, guard: Guard) -> None:
        """extractor= picks the input out of any signature."""
        seen = []

        @guard(summarizer="s", extractor=lambda state, **kw: state["messages"])
        def summarize(state: dict, *, model: str) -> str:  # type: ignore[type-arg]
            seen.append(model)
            return "Summary of the state messages, long enough."

        out = summarize({"messages": ["hello world, this is a turn"]}, model="m")
        assert seen == ["m"]
        assert decide(guard, out)["depth"] == 1

    def test_unreadable_input_is_a_clear_error(self, guard: Guard) -> None:
        """An input the ledger cannot read raises TypeError naming the type and the way out."""
        with pytest.raises(TypeError, match=r"got int.*extractor="):
            guard.check(42, summarizer="s")


def summary_text(i: int) -> str:
    return f"summary number {i}: the retry ceiling of job {i} is {i % 9}, from config"


def _digest(ledger: Ledger, text: str) -> str:
    return _provenance.digest(ledger.store.secret(), text.encode())


def source_text(i: int) -> str:
    return f"tool output {i}: deploy of service {i} finished with exit code {i % 3}"


def all_shapes(text: str) -> list[object]:
    """A known text whole, as a message, inside a block, and embedded in a longer string."""
    return [
        text,
        [Message("user", text)],
        {"role": "user", "content": [{"type": "text", "text": text}]},
        [f"earlier turns, then {text} and a new turn after it"],
    ]


class TestExactWhateverIsCached:
    """Memory bounds decide what is cached, never what is known (issue 12 regressions)."""

    CACHE = 64  # the ledger's text cache in these tests; each records 10x as many texts

    def test_summary_past_the_cache_is_still_a_summary(self) -> None:
        """Regression: a summary recorded 10x the cache ago came back as original (fail open)."""
        ledger = Ledger(MemoryStore(), max_texts=self.CACHE)
        base = Region(id="r", sources=frozenset({"cfg"}))
        for i in range(10 * self.CACHE):
            ledger.record_summary(summary_text(i), base, "w")
        for shape in all_shapes(summary_text(0)):
            region = ledger.resolve(shape, "w").region
            assert region.depth == 1 and "cfg" in region.sources, shape

    def test_sources_past_the_cache_are_not_refused(self, compile_policy) -> None:  # type: ignore[no-untyped-def]
        """Regression: past the cache, a window's own live sources were forgotten and their
        summaries refused; every source the store holds stays recognised and live."""
        guard = Guard(compile_policy(DEFAULT_LIKE))
        guard.ledger = Ledger(guard.store, max_texts=self.CACHE)
        ids = [
            guard.record_source(source_text(i), "tool_output").id for i in range(10 * self.CACHE)
        ]
        summarize = guard(
            lambda text: "Summary: deploy 0 finished with exit code 0.", summarizer="s"
        )
        out = summarize(source_text(0))
        for shape in all_shapes(out)[:3]:
            decision = guard.check(shape, summarizer="s")
            assert (decision.effect, decision.depth) == ("allow", 1), shape
        embedded = guard.ledger.resolve(all_shapes(out)[3], "w").region
        assert embedded.depth == 1 and ids[0] in embedded.sources
        assert guard.store.live(embedded.sources) >= {ids[0]}
        region = guard.ledger.resolve(all_shapes(source_text(1))[3], "w").region
        assert ids[1] in region.sources

    @pytest.mark.parametrize("cache", [1, CACHE, 65_536])
    @pytest.mark.parametrize("text", ["ok, 7", "retries are capped at 7 per deploy run"])
    def test_a_summarys_text_recorded_as_a_source_elsewhere_stays_a_summary(
        self, tmp_path: Path, cache: int, text: str
    ) -> None:
        """Regression (found by the Provenance machine, a rule added in stop 35): a process
        registered a text as a source, another then recorded the same text as a summary; the
        first, registering it again under a new id (a tool echoing it) after its small cache had
        dropped the summary's entry, stored it as plain evidence and kept it cached at depth 0:
        that process then allowed re-summarizing the summary with its sources gone. Every
        process now sees one summary resting on the new id too, and refuses."""
        path = tmp_path / "store.db"
        first = Guard(store=SQLiteStore(path), max_texts=cache)
        second = Guard(store=SQLiteStore(path), max_texts=cache)
        first.record_source(text, "config_read", "src-a")
        summarize = second(lambda messages: f"{text}\n", summarizer="s")
        assert summarize(["zq a new turn, long enough to be archived", text]) == f"{text}\n"
        for i in range(3 * cache if cache < 100 else 3):  # the first one's cache moves on
            second.record_source(source_text(100 + i), "tool_output", f"filler{i}")
        first.record_source(text, "tool_output", "src-b")
        cold = Guard(store=SQLiteStore(path), max_texts=cache)
        for guard in (first, second, cold):
            region = guard.provenance([text])
            assert region.depth == 1 and {"src-a", "src-b"} <= region.sources, (guard, region)
        first.store.evict("src-a")
        for guard in (first, second, cold):
            decision = guard.check([text], summarizer="s")
            assert decision.effect == "deny" and "src-a" in decision.dead_sources, guard

    @pytest.mark.parametrize("cache", [CACHE, 65_536])
    def test_a_text_quoting_one_rests_on_it_by_id_cached_or_not(
        self, compile_policy: Callable[[str], Any], cache: int
    ) -> None:
        """Regression (found by a deep Hypothesis run of test_record_quoting): a turn quoting a
        summary-bearing turn among more known texts than the cache holds copied that turn's
        closure (the turn had left the cache while the quoting one was resolved), so what the
        quoted text was later found to rest on too (recorded again as a summary of another
        source, since evicted) did not count, and re-summarizing the quoting turn was allowed.
        With the quoted turn still cached it was linked by id and refused; now always."""
        guard = Guard(compile_policy(DEFAULT_LIKE))
        guard.ledger = ledger = Ledger(guard.store, max_texts=cache)
        config = source_text(0)
        ledger.record_source(config, "tool_output", "cfg")
        ledger.record_summary(summary_text(0), ledger.resolve(config, "w").region, "w")
        quoted = f"{summary_text(0)} {config}"  # a turn quoting the summary and its source
        ledger.record_source(quoted, "turn", "t-quoted")
        outputs = [source_text(i) for i in range(10, 10 + 2 * self.CACHE)]
        for i, text in enumerate(outputs):
            ledger.record_source(text, "tool_output", f"out{i}")
        quoting = " ".join([quoted, *outputs])  # 2x the small cache's texts, known
        ledger.record_source(quoting, "turn", "t-quoting")
        ledger.record_source(source_text(2), "tool_output", "x")
        ledger.record_summary(quoted, ledger.resolve(source_text(2), "w").region, "w")
        guard.store.evict("x")

        for reader in (ledger, Ledger(guard.store, max_texts=cache)):  # this process, a cold one
            assert "x" in reader.resolve(quoting, "w").region.sources
        with pytest.raises(UnsafeRecompactionError):
            guard(lambda text: "Summary: the outputs were read.", summarizer="s")(quoting)

    def test_more_whole_messages_than_the_cache_holds(self) -> None:
        """An input of 300 known short summaries (whole messages, no anchor) read by a process
        whose cache holds 250: every one is a summary, though caching the store's answers
        evicts some of them before the input is resolved with them."""
        store = MemoryStore()
        ledger = Ledger(store, max_texts=250)
        texts = [f"short {i:03}" for i in range(300)]
        for i, text in enumerate(texts):
            ledger.record_summary(text, Region(f"r{i}", sources=frozenset({f"s{i}"})), "w")
        for reader in (ledger, Ledger(store, max_texts=250)):  # this process, a cold one
            region = reader.resolve(texts, "w").region
            assert {f"s{i}" for i in range(300)} <= region.sources and region.depth == 1

    def test_summary_carried_into_another_window(self) -> None:
        """Regression: a summary carried into another window (a fork) was not recognised."""
        ledger = Ledger(MemoryStore())
        ledger.record_summary(summary_text(1), Region("r", sources=frozenset({"cfg"})), "parent")
        for shape in all_shapes(summary_text(1)):
            assert ledger.resolve(shape, "forked").region.depth == 1, shape
        assert ledger.max_depth("forked") == 0  # windows scope max_depth, not recognition

    def test_a_window_is_at_least_as_deep_as_the_region_decided_in_it(self) -> None:
        """`window.max_depth` counts the region decided: a depth-2 summary carried into a new
        window (a fork) makes that window depth 2 for the policies, though nothing was
        recorded there (a window ceiling must not pass what lies in the window)."""
        guard = Guard(store=MemoryStore())
        ledger = guard.ledger
        ledger.record_source("retry ceiling is 7", kind="config_read", source_id="cfg")
        once = ledger.record_summary(
            "one: ceiling 7", ledger.resolve("retry ceiling is 7", "p").region, "p"
        )
        ledger.record_summary("two: ceiling capped", once, "p")
        with capture_decisions(guard) as seen:
            guard.check("two: ceiling capped", summarizer="s", request=Request(window="forked"))
        activation = seen[0][1]
        assert activation["region"]["depth"] == 2 and ledger.max_depth("forked") == 0
        assert activation["window"]["max_depth"] == 2
        with capture_decisions(guard) as seen:  # (where it was recorded: as deep as before)
            guard.check("two: ceiling capped", summarizer="s", request=Request(window="p"))
        assert seen[0][1]["window"]["max_depth"] == ledger.max_depth("p") == 2

    def test_another_process_recognises_what_one_recorded(self, tmp_path: Path) -> None:
        """Two processes on one store: a summary one records is known to the other, at once."""
        with SQLiteStore(tmp_path / "s.db") as one, SQLiteStore(tmp_path / "s.db") as two:
            first, second = Ledger(one), Ledger(two)
            second.resolve("warm the cache up first", "w")
            region = first.record_summary(
                summary_text(3), Region("r", sources=frozenset({"x"})), "w"
            )
            for shape in all_shapes(summary_text(3)):
                got = second.resolve(shape, "w").region
                assert got.depth == 1 and "x" in got.sources, shape
            assert second.resolve(summary_text(3), "w").region.sources == region.sources

    def test_old_summary_embedded_is_found_through_the_store(self) -> None:
        """Past the cache, a summary inside a longer string is found by asking the store."""
        store = MemoryStore()
        Ledger(store).record_summary(summary_text(5), Region("r", sources=frozenset({"y"})), "w")
        ledger = Ledger(store, max_texts=8)
        base = Region(id="r2", sources=frozenset({"z"}))
        for i in range(100, 180):
            ledger.record_summary(summary_text(i), base, "w")
        region = ledger.resolve(f"before {summary_text(5)} after, {summary_text(101)}", "w").region
        assert region.depth == 1 and {"y", "z"} <= region.sources

    def test_ten_times_the_default_windows(self) -> None:
        """With the default bounds, 10x the default window count each keeps its own max_depth."""
        ledger = Ledger(MemoryStore(), max_windows=256)
        for w in range(2560):
            ledger.record_summary(
                f"summary of window {w} is long", Region("r", depth=w % 3), f"w{w}"
            )
            ledger.max_depth(f"w{w}")
        assert [ledger.max_depth(f"w{w}") for w in range(6)] == [1, 2, 3, 1, 2, 3]
        assert ledger.resolve("summary of window 7 is long", "w2559").region.depth == 2

    def test_forgotten_window_is_reloaded_from_the_store(self) -> None:
        """A window dropped from memory gets its max_depth back from the store, in O(1)."""
        store = MemoryStore()
        ledger = Ledger(store, max_windows=1)
        ledger.record_summary(
            "summary of window A, long enough", Region(id="r", sources=frozenset({"x"})), "A"
        )
        assert ledger.max_depth("A") == 1
        assert ledger.max_depth("B") == 0  # pushes A out
        assert ledger.resolve("summary of window A, long enough", "A").region.depth == 1
        assert ledger.max_depth("A") == 1

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_a_window_deepened_by_another_process_is_seen(self, kind: str, tmp_path: Path) -> None:
        """Regression (found by a deep property run): a process that had read a window's depth
        (0) kept it while another process granted a summary there, when that summary reached
        its catch-up as of another window (the same text recorded again there first): a
        `window.max_depth` ceiling saw 0, a wrong allow. The depth is read with every call's
        view, from the store."""
        if kind == "memory":
            shared = MemoryStore()
            mine: Store = shared
            theirs: Store = shared
        else:
            mine, theirs = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
        here, elsewhere = Guard(store=mine), Guard(store=theirs)
        with capture_decisions(here) as seen:
            here.check("first turn of the session", summarizer="s", request=Request(window="w1"))
        assert seen[-1][1]["window"]["max_depth"] == 0
        elsewhere.ledger.record_source("retry ceiling is 7", kind="config_read", source_id="cfg")
        of = elsewhere.ledger.resolve("retry ceiling is 7", "w1").region
        elsewhere.ledger.record_summary("Summary: the ceiling is 7.", of, "w1")
        elsewhere.ledger.record_summary("Summary: the ceiling is 7.", of, "w2")
        with capture_decisions(here) as seen:
            here.check("a new turn", summarizer="s", request=Request(window="w1"))
        assert seen[-1][1]["window"]["max_depth"] == 1 == mine.window_depth("w1")
        here.close()
        elsewhere.close()

    def test_shared_prefix_sources_are_told_apart(self) -> None:
        """Sources sharing a long header are each recognised exactly (unique anchors)."""
        ledger = Ledger(MemoryStore())
        header = "=== tool: shell, cwd: /srv/app, exit status follows ===\n" * 3
        ids = [ledger.record_source(f"{header}result {i}", "tool_output").id for i in range(300)]
        for i in (0, 1, 150, 299):
            region = ledger.resolve(f"turn: {header}result {i} -- done", "w").region
            assert region.sources - {s for s, _ in ledger.resolve("turn: ", "w").unregistered}
            assert ids[i] in region.sources
            assert not set(ids) - {ids[i]} & region.sources

    def test_rolling_chain_rests_on_every_turn(self) -> None:
        """A rolling chain of 300 passes, each adding one turn, rests on all 300 turns."""
        ledger = Ledger(MemoryStore(), max_texts=32)
        current: list[str] = []
        turns = []
        for i in range(300):
            turns.append(ledger.record_source(source_text(i), "user_turn").id)
            resolution = ledger.resolve([*current, source_text(i)], "w")
            current = [summary_text(i)]
            ledger.record_summary(summary_text(i), resolution.region, "w")
        region = ledger.resolve(current, "w").region
        assert (region.depth, region.sources) == (300, frozenset(turns))

    def test_same_output_twice_keeps_the_first_sources(self) -> None:
        """A summarizer returning the same text for a deeper input keeps every source it rested
        on: re-recording a text only adds provenance (else cfg's eviction would go unseen)."""
        ledger = Ledger(MemoryStore())
        ledger.record_source("config: retry_ceiling = 7", "config_read", "cfg")
        first = ledger.resolve(["config: retry_ceiling = 7"], "w")
        ledger.record_summary("retry ceiling is 7, per the config", first.region, "w")
        again = ledger.resolve(["retry ceiling is 7, per the config", "user: notify #ops"], "w")
        ledger.record_summary("retry ceiling is 7, per the config", again.region, "w")
        region = ledger.resolve("retry ceiling is 7, per the config", "w").region
        assert region.depth == 2 and "cfg" in region.sources


class TestBuiltWithoutInit:
    def test_hot_path_objects_have_every_field(self) -> None:
        """The ledger builds Regions, Entries and Resolutions without their `__init__`
        (`_provenance._made`): each has exactly its dataclass's fields and equals one built the
        usual way (a field added to the class and not to a hot path fails here)."""
        store = MemoryStore()
        ledger = Ledger(store)
        ledger.record_source(source_text(1), "tool_output", "t1")
        base = Region("r", sources=frozenset({"t1"}), source_kinds=frozenset({"tool_output"}))
        first = ledger.record_summary(summary_text(1), base, "w")
        again = ledger.record_summary(summary_text(1), Region("q", sources=frozenset({"x"})), "w")
        resolution = ledger.resolve(f"{summary_text(1)} then {source_text(1)} and new words", "w")
        entry = store.lookup([_digest(ledger, summary_text(1))])[_digest(ledger, summary_text(1))]
        for made in (first, again, resolution, resolution.region, entry):
            names = [f.name for f in dataclasses.fields(made)]
            assert list(vars(made)) == names, type(made).__name__
            assert made == type(made)(**{n: getattr(made, n) for n in names})


class TestHashedOnce:
    """A text is hashed once in the ledger however it enters (a turn recorded comes back in
    the next input as a message): BLAKE2b over it was most of what recording it cost."""

    def test_a_recorded_turn_is_hashed_once_by_the_ledger(self) -> None:
        """record_source hashes the turn once in the ledger (MemoryStore's `put_source` hashes
        it under its own secret, from a hash keyed once, not through `digest`:
        tests/test_stores_entries.py), and resolving it next hashes nothing."""
        ledger = Ledger(MemoryStore())
        turn = source_text(3) + " and its tail"
        data = turn.encode()
        real = _provenance.digest
        hashed: list[bytes] = []

        def counted(key: bytes, text: bytes) -> str:
            hashed.append(bytes(text))
            return real(key, text)

        with mock.patch.object(_provenance, "digest", counted):
            ledger.record_source(turn, "user_turn", "turn-1")
            assert hashed.count(data) == 1  # the ledger's once
            hashed.clear()
            region = ledger.resolve([turn], "w").region
        assert data not in hashed
        assert region.sources == frozenset({"turn-1"}) and region.depth == 0

    @pytest.mark.parametrize("tail", ["", "  \n", "\t"])
    def test_the_store_is_handed_the_digest_the_ledger_made(self, tail: str) -> None:
        """MemoryStore takes the turn's digest from the ledger (`put_source_hashed`) and
        hashes nothing itself; the entry it holds is the one it makes by hashing, so the turn
        is found by its own digest (the whole text's, whitespace and all) and anchor."""
        store = MemoryStore()
        ledger = Ledger(store)
        turn = source_text(4) + " and a tail" + tail
        data = turn.encode()
        hashed: list[bytes] = []
        real = _provenance.KeyedHashes.digest

        def counted(hashes: _provenance.KeyedHashes, text: bytes | memoryview) -> str:
            hashed.append(bytes(text))
            return real(hashes, text)

        with mock.patch.object(_provenance.KeyedHashes, "digest", counted):
            ledger.record_source(turn, "user_turn", "turn-1")
        assert data not in hashed
        expected = Entry.of_source(store.secret(), Source("turn-1", "user_turn"), turn)
        key = store.secret()
        assert store.lookup([_provenance.digest(key, data)]) == {expected.digest: expected}
        assert store.by_anchor([_provenance.anchor_of(key, data) or ""]) == [expected]
        assert ledger.resolve([turn], "w").region.sources == frozenset({"turn-1"})

    def test_a_put_source_overridden_is_called(self) -> None:
        """A `put_source` overridden, by a subclass, on the instance (after the ledger was
        made) or by a wrapper passing every other attribute on, is what the ledger's records
        call, given no digest: it hashes the text itself."""

        class Counting(MemoryStore):
            calls: ClassVar[list[str]] = []

            def put_source(self, source: Source, text: str) -> None:
                self.calls.append(source.id)
                super().put_source(source, text)

        turn = source_text(5) + " and its tail"
        store = Counting()
        Ledger(store).record_source(turn, "user_turn", "turn-1")
        assert Counting.calls == ["turn-1"]
        patched = MemoryStore()
        ledger = Ledger(patched)
        calls: list[str] = []
        put = patched.put_source

        def counting(source: Source, text: str) -> None:
            calls.append(source.id)
            put(source, text)

        patched.put_source = counting  # type: ignore[method-assign]
        ledger.record_source(turn, "user_turn", "turn-1")
        assert calls == ["turn-1"]

        class Wrapper:  # passes every other attribute on, `put_source_hashed` too
            def __init__(self, inner: MemoryStore) -> None:
                self.inner = inner

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

            def put_source(self, source: Source, text: str) -> None:
                calls.append(f"wrapped {source.id}")
                self.inner.put_source(source, text)

        wrapped = MemoryStore()
        Ledger(Wrapper(wrapped)).record_source(turn, "user_turn", "turn-1")
        assert calls == ["turn-1", "wrapped turn-1"]
        for held in (store, patched, wrapped):
            found = held.lookup([_provenance.digest(held.secret(), turn.encode())])
            assert [e.id for e in found.values()] == ["turn-1"]


class TestRememberedSplits:
    """The ledger remembers where known texts lie in a message it split (`Ledger._found`), the
    store's answers too: a remembered "nothing there" must never hide a text the store learned
    since, from this process or another."""

    MESSAGE = "head words first. {} and tail words after it."

    @pytest.mark.parametrize("cache", [2, 65_536])
    def test_another_process_records_a_summary_inside_a_split_message(
        self, tmp_path: Path, cache: int
    ) -> None:
        """A message split twice (the second time from memory) by a process whose cache is past
        its bound (so the store was asked at every position) or complete; then another process
        on the same SQLite file records a summary inside it, and three texts after it (which
        push the summary out of the small cache as soon as it is learnt): the next resolve
        finds the summary and its source."""
        message = self.MESSAGE.format(summary_text(7))
        with SQLiteStore(tmp_path / "s.db") as one, SQLiteStore(tmp_path / "s.db") as two:
            first, second = Ledger(one, max_texts=cache), Ledger(two)
            for i in range(3):
                first.record_source(source_text(i), "tool_output", f"t{i}")
            for _ in range(2):
                assert first.resolve(message, "w").region.depth == 0
            second.record_summary(summary_text(7), Region("r", sources=frozenset({"cfg"})), "w")
            for i in range(3, 6):
                second.record_source(source_text(i), "tool_output", f"t{i}")
            region = first.resolve(message, "w").region
            assert region.depth == 1 and "cfg" in region.sources

    def test_a_summary_recorded_here_is_found_in_a_split_message(self) -> None:
        """The same within one process: the split of a message is redone once the ledger has
        indexed a text (its own output) that lies inside it."""
        ledger = Ledger(MemoryStore())
        message = self.MESSAGE.format(summary_text(8))
        assert ledger.resolve(message, "w").region.depth == 0
        ledger.record_summary(summary_text(8), Region("r", sources=frozenset({"cfg"})), "w")
        region = ledger.resolve(message, "w").region
        assert region.depth == 1 and "cfg" in region.sources

    @deep.scaled(settings(max_examples=60, deadline=None))
    @given(
        cache=st.integers(1, 6),
        ops=st.lists(
            st.tuples(
                st.sampled_from(["summary", "source", "other", "resolve"]), st.integers(0, 7)
            ),
            max_size=30,
        ),
    )
    def test_resolutions_match_a_fresh_ledgers(
        self, cache: int, ops: list[tuple[str, int]]
    ) -> None:
        """Whatever this ledger (small cache, remembered splits) and another one on the same
        store recorded in between, resolving a message gives what a new ledger on that store,
        with nothing remembered, gives."""
        store = MemoryStore()
        ledger, other = Ledger(store, max_texts=cache), Ledger(store)
        messages = [  # two summaries each, in ASCII and not (byte offsets are not characters)
            ("café: " if i % 2 else "")
            + self.MESSAGE.format(" and ".join(summary_text(j) for j in range(i % 4, i % 4 + 2)))
            for i in range(8)
        ]
        for op, i in ops:
            if op == "summary":  # by either process
                by = ledger if i % 2 else other
                by.record_summary(
                    summary_text(i % 5), Region(f"r{i}", sources=frozenset({f"s{i}"})), "w"
                )
            elif op == "source":
                ledger.record_source(source_text(i), "tool_output", f"t{i}")
            elif op == "other":
                other.record_source(summary_text(i % 5), "tool_output", f"quoted{i}")
            else:
                got = ledger.resolve(messages[i], "w")
                fresh = Ledger(store).resolve(messages[i], "w")
                assert (got.region, got.unregistered, got.summaries) == (
                    fresh.region,
                    fresh.unregistered,
                    fresh.summaries,
                )


def _anchored(index: Index) -> int:
    """Items in the automata and batches of both of an index's pools (sources, summaries)."""
    pools = (index._sources, index._summaries)
    return sum(len(pool.fresh) + sum(level.size for level in pool.levels) for pool in pools)


class TestIndexMemory:
    def test_discarded_texts_do_not_pile_up(self) -> None:
        """A long run that keeps 100 texts indexed, discarding the oldest as each new one comes,
        holds at most about twice that many anchors (sources' and summaries'), and finds exactly
        the ones kept."""
        index = Index()
        texts = [f"text number {i:05} with enough bytes to anchor".encode() for i in range(5000)]
        for i, data in enumerate(texts):
            index.add(data, f"d{i}", summary=i % 3 == 0)  # both pools fill and merge
            if i >= 100:
                index.discard(f"d{i - 100}")
        held = _anchored(index)
        assert len(index) == 100
        assert held <= 2 * 100 + 2 * _BATCH and len(index._used) <= held
        found = {digest for _, _, digest in index.find(b" | ".join(texts[4800:]))}
        assert found == {f"d{i}" for i in range(4900, 5000)}

    def test_texts_discarded_and_added_again_are_not_copied(self) -> None:
        """A working set cycling through a bounded cache (64 texts, half of them discarded and
        added again, 200 times) keeps one copy of each in the automata, not one per cycle, and
        still finds exactly the ones held."""
        index = Index()
        texts = [(f"text number {i:05} " + "abcdefgh" * 8).encode() for i in range(64)]
        for _ in range(200):
            for i, data in enumerate(texts):
                index.add(data, f"d{i}", summary=i % 4 == 1)
            for i in range(0, 64, 2):
                index.discard(f"d{i}")
        held = _anchored(index)
        assert len(index) == 32
        assert held <= 2 * 64 + 2 * _BATCH and len(index._used) <= held
        found = {digest for _, _, digest in index.find(b" | ".join(texts))}
        assert found == {f"d{i}" for i in range(1, 64, 2)}

    def test_a_ledger_cycling_summaries_through_its_cache_keeps_its_index_bounded(self) -> None:
        """A ledger caching 8 texts, fed 32 summaries quoted inside longer turns 100 times over
        (each found again in the store by anchor, cached and indexed, then forgotten), holds
        at most a few batches of anchors, and recognises every one of them every time."""
        ledger = Ledger(MemoryStore(), max_texts=8)
        base = Region.of_source(Source("src", "tool_output"))
        texts = [f"summary {i:03}: the retry ceiling is seven, read from config" for i in range(32)]
        for text in texts:
            ledger.record_summary(text, base, "w")
        for _ in range(100):
            for text in texts:
                region = ledger.resolve(f"a turn quoting it: {text} and more after", "w").region
                assert region.depth == 1 and "src" in region.sources
        index = ledger._index
        held = _anchored(index)
        assert len(ledger._entries) == 8 and held <= 2 * 32 + 2 * _BATCH


#: An index's life: add text i, discard text i, or search an input made of some of these texts
#: or all of them (large: past `_LARGE_INPUT`, where levels merge and small ones are searched
#: with `find`; or small).
_INDEX_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 79), st.booleans()),
        st.tuples(st.just("discard"), st.integers(0, 79)),
        st.tuples(
            st.just("find"),
            st.lists(st.integers(0, 79), max_size=12) | st.just(list(range(80))),
            st.booleans(),
        ),
    ),
    max_size=300,
)


class TestIndexIncremental:
    @deep.scaled(settings(max_examples=60, deadline=None))
    @given(
        first=st.integers(0, 80),
        ops=_INDEX_OPS,
        find_max=st.sampled_from([_index._FIND_MAX, 80]),
    )
    def test_every_occurrence_is_a_candidate_whatever_the_history(
        self, first: int, ops: list[tuple[Any, ...]], find_max: int
    ) -> None:
        """Whatever adds, discards and searches came before (batches folded, levels merged,
        small levels searched by `find`: with the shipped bound, and one so high that every
        level is), every place an indexed text occurs in an input is among the candidates, and
        no discarded text is: compared with a brute-force search."""
        adds: list[tuple[Any, ...]] = [("add", i) for i in range(first)]  # levels to start
        with mock.patch.object(_index, "_FIND_MAX", find_max):
            self._run(adds + ops)

    def _run(self, ops: list[tuple[Any, ...]]) -> None:
        large = b" plain words between. " * (_LARGE_INPUT // 22 // 2 + 1)
        replay(Index(), known_texts(200), ops, lambda big: large if big else large[:22])


class TestKeyedIds:
    """Issue 13 item 8: ids that leave the process are keyed, so short texts cannot be guessed."""

    def test_pin_cannot_be_recovered_from_ids(self, guard: Guard) -> None:
        """Hashing all 10,000 PINs does not give any id the guard emits for "my PIN is 4711"."""
        import hashlib

        with capture_decisions(guard) as seen:
            guard.check("my PIN is 4711", summarizer="probe")
        region = seen[0][1]["region"]
        emitted = {region["id"], *region["sources"]}
        for pin in range(10_000):
            data = f"my PIN is {pin:04d}".encode()
            for guess in (
                hashlib.sha256(data).hexdigest()[:16],
                hashlib.blake2b(data, digest_size=16).hexdigest()[:16],
            ):
                assert not any(guess in e for e in emitted)

    def test_same_store_same_ids_other_store_other_ids(self, tmp_path: Path) -> None:
        """Two processes sharing a store give a text the same id; another store, another id."""
        a1, a2, b = (SQLiteStore(tmp_path / n) for n in ("a.db", "a.db", "b.db"))
        with a1, a2, b:
            ids = [Ledger(s).resolve("my PIN is 4711", "w").region.id for s in (a1, a2, b)]
            src = [Ledger(s).record_source("my PIN is 4711", "user_turn").id for s in (a1, a2, b)]
        assert ids[0] == ids[1] != ids[2]
        assert src[0] == src[1] != src[2]


class TestRecognitionOverlaps:
    def test_summary_that_starts_with_a_source_is_a_summary(self) -> None:
        """A summary quoting a source at its start is still found whole, one pass deeper."""
        ledger = Ledger(MemoryStore())
        source = "retry ceiling is 7 for the billing job"
        ledger.record_source(source, "config_read", "cfg")
        summary = source + ", and retries back off exponentially"
        ledger.record_summary(summary, Region("r", sources=frozenset({"cfg"})), "w")
        region = ledger.resolve(f"earlier turns: {summary} then more", "w").region
        assert region.depth == 1

    def test_summary_overlapping_the_end_of_a_source_is_a_summary(self) -> None:
        """A summary whose text starts inside a source's and runs past it is in the input whole:
        the region rests on it too (its end used to pass for original content: a wrong allow)."""
        ledger = Ledger(MemoryStore())
        source = "retry ceiling is 7 for the billing job, said the config"
        ledger.record_source(source, "config_read", "cfg")
        summary = "said the config; retries back off exponentially after that"
        ledger.record_summary(summary, Region("r", sources=frozenset({"gone"})), "w")
        text = source + summary[len("said the config") :]
        region = ledger.resolve(f"turn: {text} end", "w").region
        assert region.depth == 1 and {"cfg", "gone"} <= region.sources

    @pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
    @pytest.mark.parametrize("tail", ["", " then more"], ids=["its-end-last", "text-after"])
    def test_the_end_of_a_text_overlapping_another_is_that_texts(
        self, cached: bool, tail: str
    ) -> None:
        """The same, every source live: the summary's end past the source is the summary's own
        text, not unrecognised content. It was also taken for original content resting on no
        store (a gap), and the input was refused though both texts can be given back."""
        store = MemoryStore()
        guard = Guard(store=store)
        source = "retry ceiling is 7 for the billing job, said the config"
        guard.record_source(source, "config_read", "cfg")
        guard.record_source("the live base of the summary", "tool_output", "base")
        summary = "said the config; retries back off exponentially after that"
        based = guard.provenance(["the live base of the summary"])
        guard.ledger.record_summary(summary, based, "w")
        text = source + summary[len("said the config") :] + tail
        reader = guard if cached else Guard(store=store)
        resolution = reader.ledger.resolve(text, "w")
        assert [gap for _, gap in resolution.unregistered] == ([tail] if tail else [])
        region = resolution.region
        assert region.depth == 1 and region.sources >= {"cfg", "base"}
        assert region.chars == len(text)
        assert reader.check([text], summarizer="s", enforce=False).allowed is not bool(tail)

    @pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
    def test_overlapping_chunks_of_a_document_leave_nothing_unregistered(
        self, cached: bool
    ) -> None:
        """A document registered as chunks that overlap (a chunker's usual overlap), given
        whole with a summary after it: the end of a chunk starting inside the one before is
        that chunk's own text (found by `POLICYHOOK_DEEP=30`: it was taken for unregistered
        content, and the summary's region refused though every byte is held). A summary inside
        such an end is still found; with that chunk gone, the region is refused."""
        store = MemoryStore()
        guard = Guard(store=store)
        document = "".join(
            f"line {i}: the retry ceiling of job {i} is {i % 9}\n" for i in range(12)
        )
        chunks = [document[0:200], document[150:400], document[350:]]
        for i, chunk in enumerate(chunks):
            guard.record_source(chunk, "tool_output", f"chunk-{i}")
        guard.record_source("the live base of the summary", "tool_output", "base")
        summary = "zq summary: retry ceilings range 0 to 8 across twelve jobs"
        guard.ledger.record_summary(
            summary, guard.provenance(["the live base of the summary"]), "w"
        )
        text = f"{document}{summary}"
        reader = guard if cached else Guard(store=store)
        resolution = reader.ledger.resolve(text, "w")
        assert resolution.unregistered == ()
        region = resolution.region
        assert region.depth == 1 and region.chars == len(text)
        assert region.sources == {"chunk-0", "chunk-1", "chunk-2", "base"}
        assert reader.check([text], summarizer="s", enforce=False).effect == "allow"
        # A summary quoted inside a chunk's end is found there, not hidden by it.
        quoting = f"{document[:300]}{summary}{document[300:]}"
        assert reader.ledger.resolve(quoting, "w").region.depth == 1
        store.evict("chunk-1")
        refused = Guard(store=store).check([text], summarizer="s", enforce=False)
        assert refused.effect == "deny"

    def test_text_recorded_as_source_and_summary(self) -> None:
        """The same text known as a source and as a summary resolves instead of crashing."""
        ledger = Ledger(MemoryStore())
        text = "retry ceiling is 7 for the billing job"
        ledger.record_source(text, "config_read", "cfg")
        ledger.record_summary(text, Region("r", sources=frozenset({"cfg"})), "w")
        region = ledger.resolve(f"earlier turns: {text} then more", "w").region
        assert "cfg" in region.sources

    def test_non_ascii_input_positions(self) -> None:
        """Known texts are cut at the right places in input with multi-byte characters."""
        ledger = Ledger(MemoryStore())
        source = "configuración: límite de reintentos = 7 ✓"
        ledger.record_source(source, "config_read", "cfg")
        resolution = ledger.resolve(f"日本語のテキスト {source} 終わり", "w")
        assert resolution.region.sources - {"cfg"} == {s for s, _ in resolution.unregistered}
        assert [t for _, t in resolution.unregistered] == ["日本語のテキスト ", " 終わり"]

    def test_many_new_summaries_are_all_recognised(self) -> None:
        """Each of many summaries recorded one after another is recognised at once."""
        ledger = Ledger(MemoryStore())
        for i in range(60):
            text = f"summary number {i}: the retry ceiling was discussed ({i * 7})"
            ledger.record_summary(text, Region(f"r{i}", sources=frozenset({f"s{i}"})), "w")
            region = ledger.resolve(f"turns before. {text} turns after.", "w").region
            assert f"s{i}" in region.sources and region.depth == 1

    @pytest.mark.parametrize("size", [1_000, 70_000, 300_000])
    def test_every_summary_is_found_in_small_and_large_inputs(self, size: int) -> None:
        """Large inputs are searched with merged automata and the new texts' batch as one: each
        of 300 summaries recorded one by one (some in automata, some still in the batch, some
        past the cache) is found, wherever it sits in an input of `size` characters."""
        ledger = Ledger(MemoryStore(), max_texts=250)
        texts = [
            f"summary {i:03}: the ceiling {i * 7} was kept; " + "words " * 8 for i in range(300)
        ]
        for i, text in enumerate(texts):
            ledger.record_summary(text, Region(f"r{i}", sources=frozenset({f"s{i}"})), "w")
        filler = "plain new words. " * (size // 17 // 30 + 1)
        for picked in (range(0, 300, 29), range(280, 300), range(5, 300, 7)):
            value = filler.join(texts[i] for i in picked)
            region = ledger.resolve(f"head {filler}{value}{filler} tail", "w").region
            assert {f"s{i}" for i in picked} <= region.sources and region.depth == 1
            ledger.record_summary(f"one more output {len(value)}: " + "x" * 40, region, "w")


class _Unreachable(MemoryStore):
    """A store whose text index stops answering (a shared store gone down)."""

    down = False

    def lookup(self, digests):  # type: ignore[no-untyped-def]
        if self.down:
            raise ConnectionError("store at 127.0.0.1:1 did not answer")
        return super().lookup(digests)

    def since(self, cursor, limit):  # type: ignore[no-untyped-def]
        if self.down:
            raise ConnectionError("store at 127.0.0.1:1 did not answer")
        return super().since(cursor, limit)


class TestStoreDownFailsClosed:
    def test_text_the_cache_cannot_tell_counts_as_a_dead_summary(
        self, guard: Guard, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Store down: a message not cached may be a summary, so it is refused, with a warning;
        a cached summary is still recognised as what it is."""
        store = _Unreachable()
        guard.ledger = Ledger(store)
        guard.store = store
        known = summary_text(1)
        guard.ledger.record_summary(known, Region("r", sources=frozenset({"cfg"})), "w")
        store.down = True
        with caplog.at_level("WARNING", logger="policyhook"):
            region = guard.ledger.resolve(["a message never seen before, maybe a summary"], "w")
        assert region.region.depth == 1
        assert region.region.source_kinds == {"unverifiable"}
        assert "store unreachable" in caplog.text and "127.0.0.1:1" in caplog.text
        cached = guard.ledger.resolve([known], "w").region
        assert (cached.depth, cached.sources) == (1, frozenset({"cfg"}))
        store.down = False
        assert (
            guard.ledger.resolve(["a message never seen before, maybe a summary"], "w").region.depth
            == 0
        )


class TestClosures:
    def test_a_merge_by_another_process_reaches_cached_chains(self, tmp_path: Path) -> None:
        """A summary re-recorded by another process (merged: one more source) is seen with its
        new source by a process that had the old closure cached."""
        with SQLiteStore(tmp_path / "s.db") as one, SQLiteStore(tmp_path / "s.db") as two:
            first, second = Ledger(one), Ledger(two)
            s1 = first.record_summary(summary_text(1), Region("r", sources=frozenset({"a"})), "w")
            s2 = first.record_summary(
                summary_text(2), first.resolve(summary_text(1), "w").region, "w"
            )
            assert first.resolve(summary_text(2), "w").region.sources == {"a"}
            second.record_summary(summary_text(1), Region("r2", sources=frozenset({"b"})), "w")
            assert first.resolve(summary_text(2), "w").region.sources == {"a", "b"}
            assert s1.depth == 1 and s2.depth == 2

    def test_a_summary_recorded_again_with_a_new_source_reaches_summaries_of_it(self) -> None:
        """A summary recorded again on another source (merged: it rests on both) is seen with
        the new source through every summary resting on it, in the same process."""
        ledger = Ledger(MemoryStore())
        ledger.record_summary(summary_text(1), Region("r", sources=frozenset({"a"})), "w")
        ledger.record_summary(summary_text(2), ledger.resolve(summary_text(1), "w").region, "w")
        assert ledger.resolve(summary_text(2), "w").region.sources == {"a"}
        ledger.record_summary(summary_text(1), Region("r2", sources=frozenset({"b"})), "w")
        assert ledger.resolve(summary_text(2), "w").region.sources == {"a", "b"}
        assert ledger.resolve(summary_text(1), "w").region.sources == {"a", "b"}

    def test_the_same_input_summarized_again_walks_nothing_and_stays_exact(self) -> None:
        """A loop summarizing one input again (a new output each time) keeps the closure of the
        summary it was made from, so the next resolve does not walk it; evicting one of that
        summary's sources is still seen on the next call."""
        store = MemoryStore()
        ledger = Ledger(store)
        for source in "abc":
            store.put_source(Source(source, "tool_output"), f"the original text of source {source}")
        parent = ledger.record_summary(summary_text(1), Region("r", sources=frozenset("ab")), "w")
        value = [summary_text(1), "a new turn, long enough to be searched for inside text"]
        with mock.patch.object(Ledger, "_walk", wraps=ledger._walk) as walk:
            for i in range(3):
                region = ledger.resolve(value, "w").region
                ledger.record_summary(f"a new output {i}: {summary_text(9)}", region, "w")
            assert walk.call_count == 0  # the parent's closure was kept, not walked again
        assert ledger._closures.get(parent.id) == frozenset("ab")
        store.evict("b")
        resolution = ledger.resolve(value, "w")
        assert {"a", "b"} <= resolution.region.sources and resolution.live is not None
        assert "b" not in resolution.live

    @deep.scaled(settings(max_examples=60, deadline=None))
    @given(
        st.lists(
            st.tuples(st.sampled_from(["", " ", "\n", "\t "]), st.integers(0, 3),
                      st.sampled_from(["", " ", "\n\n"])),
            min_size=1, max_size=6,
        )
    )  # fmt: skip
    def test_remembered_digests_resolve_as_fresh_ones(
        self, messages: list[tuple[str, int, str]]
    ) -> None:
        """Messages whose digests are remembered (`_message_digests`) resolve exactly as with
        every digest computed again: known summaries, with whitespace around them or not."""
        store = MemoryStore()
        ledger, fresh = Ledger(store), Ledger(store)
        texts = [summary_text(i) for i in range(3)] + ["a turn no store holds, long enough"]
        for i, text in enumerate(texts[:3]):
            ledger.record_summary(text, Region(f"r{i}", sources=frozenset({f"s{i}"})), "w")
        value = [before + texts[i] + after for before, i, after in messages]
        for _ in range(2):
            got = ledger.resolve(value, "w")
            with mock.patch.object(_provenance, "_HASHED_CHARS", -1):  # nothing remembered
                fresh._hashed.clear()
                expected = fresh.resolve(value, "w")
            assert (got.region, got.unregistered, got.summaries) == (
                expected.region, expected.unregistered, expected.summaries,
            )  # fmt: skip
            assert got.region.depth == (0 if all(i == 3 for _, i, _ in messages) else 1)

    def test_a_str_subclass_is_never_taken_for_a_remembered_text(self) -> None:
        """A str subclass that compares equal to any text is hashed for what it holds, not
        given the digests remembered for a text it claims to equal."""

        class Equal(str):
            def __eq__(self, other: object) -> bool:
                return True

            def __hash__(self) -> int:
                return hash(summary_text(1))

        ledger = Ledger(MemoryStore())
        ledger.record_summary(summary_text(1), Region("r", sources=frozenset({"a"})), "w")
        assert ledger.resolve(summary_text(1), "w").region.depth == 1
        assert (
            ledger.resolve([Equal("a turn that is no summary at all, long")], "w").region.depth == 0
        )

    def test_a_summary_recorded_again_deeper_on_the_same_sources_keeps_closures(self) -> None:
        """Recorded again deeper but on the same sources (a summarizer giving the same text),
        a summary's provenance only gets deeper: the closures resting on it stay cached, and
        stay exact."""
        ledger = Ledger(MemoryStore())
        s1 = ledger.record_summary(summary_text(1), Region("r", sources=frozenset({"a"})), "w")
        s2 = ledger.record_summary(
            summary_text(2), ledger.resolve(summary_text(1), "w").region, "w"
        )
        deeper = Region("r3", depth=4, sources=frozenset({"a"}), source_kinds=frozenset({"k"}))
        ledger.record_summary(summary_text(1), deeper, "w")
        assert ledger._closures.get(s2.id) == frozenset({"a"})  # kept: nothing it rests on grew
        assert ledger.resolve(summary_text(1), "w").region.depth == 5
        assert ledger.resolve(summary_text(2), "w").region.sources == {"a"}
        assert ledger.resolve(summary_text(1), "w").region.source_kinds == {"k"}
        assert s1.depth == 1

    def test_a_summary_recorded_again_on_fewer_sources_still_rests_on_all(self) -> None:
        """Recorded again from an input resting on only some of its sources, a summary still
        rests on all of them (provenance only grows): its cached closure is never replaced by
        the new input's smaller set, so a source it lost is seen dead (no wrong allow)."""
        store = MemoryStore()
        guard_ledger = Ledger(store)
        for source_id in ("a", "b"):
            store.put_source(Source(source_id, "config_read"), f"original text of {source_id}")
        both = Region("r", sources=frozenset({"a", "b"}))
        guard_ledger.record_summary(summary_text(1), both, "w")
        assert guard_ledger.resolve(summary_text(1), "w").region.sources == {"a", "b"}
        guard_ledger.record_summary(summary_text(1), Region("r2", sources=frozenset({"a"})), "w")
        store.evict("b")
        resolved = guard_ledger.resolve(summary_text(1), "w")
        assert resolved.region.sources == {"a", "b"}
        assert resolved.live == frozenset({"a"})
