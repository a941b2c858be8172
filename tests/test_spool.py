"""The spool: a store outage still leaves the window in budget.

With the store down, every re-summarization is refused and no remedy can archive in the store;
a guard given a spool (a second, local store) archives there instead, so the pointer takes the
region's place, the archive can be read back meanwhile, and once the store answers what the
spool holds is moved to it, for every process sharing the store to see.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deep
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from outage import STORE_METHODS, one_fault, store_down
from test_telemetry import Otel
from test_telemetry import telemetry as telemetry  # the fixture

from policyhook import (
    Guard,
    MemoryStore,
    SQLiteStore,
    Store,
    UnsafeRecompactionError,
    _spool,
    remedies,
)
from policyhook._telemetry import STORE_ERRORS

POLICYHOOK = str(Path(sys.executable).parent / "policyhook")
CONFIG = "config/agent.yaml: retry_ceiling: 7  # max retries for flaky tool calls"
TURN = "user: the deploy timed out again, page the on-call"
#: What a move writes with: the archive's put, the pointer's (hashed by the ledger if it can).
WRITES = ("put_source", "put_source_hashed")


def summary_of(texts: list[str]) -> str:
    return "summary: " + " / ".join(t[:24] for t in texts)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Any = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "main.db")
    yield made
    if isinstance(made, SQLiteStore):
        made.close()


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[SQLiteStore]:
    made = SQLiteStore(tmp_path / "spool.db")
    yield made
    made.close()


def agent(store: Store, spool: Store | None) -> tuple[Guard, Callable[[list[str]], str], str]:
    """A guard (with `spool`), its summarizer with remedies on, and a granted depth-1 summary."""
    guard = Guard(store=store, spool=spool)
    summarize = guard(summary_of, summarizer="compact", remedy=True)
    guard.record_source(CONFIG, kind="config_read", source_id="cfg-7")
    return guard, summarize, summarize([CONFIG])


def spooled(spool: Store) -> dict[str, str]:
    return {source.kind: text for source, text in spool.sources(100)}


class TestThroughAnOutage:
    def test_the_pointer_takes_the_region_s_place_and_reads_back(
        self, store: Store, spool: SQLiteStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The store down: the pass is refused (it cannot be decided) and the remedy archives in
        the spool: the call returns the pointer in the region's place, and the archive reads
        back exactly, from the spool."""
        guard, summarize, summary = agent(store, spool)
        region = [summary, TURN]
        with store_down(store), caplog.at_level(logging.WARNING, logger="policyhook"):
            text = summarize(region)
            [ref] = remedies.pointers(text)
            assert guard.retrieve(ref) == region
        assert text.startswith(remedies.POINTER_PREFIX)
        assert "kept in the spool" in caplog.text and TURN not in caplog.text
        assert set(spooled(spool)) == {remedies.OFFLOAD_KIND, remedies.POINTER_KIND}
        assert spooled(spool)[remedies.POINTER_KIND] == text
        assert store.get_source(ref) is None  # not moved yet: the store has not been asked

    def test_the_remedy_span_says_the_store_refused_the_archive(
        self, store: Store, spool: SQLiteStore, telemetry: Otel
    ) -> None:
        """Operators see where the archive went: the remedy applied, with its ref, and the
        store's refused write on the same span and on `policyhook.store.errors`."""
        guard = telemetry.guard(store=store, spool=spool)
        summarize = guard(summary_of, summarizer="compact", remedy=True)
        guard.record_source(CONFIG, kind="config_read", source_id="cfg-7")
        summary = summarize([CONFIG])
        with store_down(store):
            [ref] = remedies.pointers(summarize([summary, TURN]))
        [span] = telemetry.spans("policyhook.remedy")
        attributes = dict(span.attributes or {})
        assert attributes["policyhook.remedy.outcome"] == "applied"
        assert attributes["policyhook.remedy.ref"] == ref
        assert attributes["policyhook.store.error"] == "put_source"
        assert telemetry.total(STORE_ERRORS, operation="put_source") == 1

    def test_the_remedy_says_its_archive_is_in_the_spool(
        self, store: Store, spool: SQLiteStore
    ) -> None:
        """`Remedied.spooled` tells a caller its archive waits in this process's spool (only
        this process reads it back) until the store answers; an archive the store took is
        not spooled."""
        guard, _, summary = agent(store, spool)
        region = [summary, TURN]
        with store_down(store):
            with pytest.raises(UnsafeRecompactionError) as refused:
                guard.check(region, summarizer="compact", enforce=True)
            remedied = guard.remedy(refused.value, region, summarizer="compact")
        assert remedied.spooled and remedied.text.startswith(remedies.POINTER_PREFIX)
        assert remedied.ref in {source.id for source, _ in spool.sources(10)}
        guard.check([CONFIG], summarizer="compact")  # the store answers: the spool is moved
        assert store.get_source(remedied.ref) is not None
        refusal = UnsafeRecompactionError(refused.value.decision)
        again = guard.remedy(refusal, [summary, TURN, "user: more"], summarizer="compact")
        assert again.ref is not None and not again.spooled

    def test_without_a_spool_the_refusal_stands(self, store: Store) -> None:
        """The behaviour a spool changes: no remedy can archive, the refusal is raised again
        and the caller keeps its window."""
        _, summarize, summary = agent(store, None)
        with store_down(store), pytest.raises(UnsafeRecompactionError) as refused:
            summarize([summary, TURN])
        assert refused.value.store_failed

    def test_the_spool_failing_too_leaves_the_refusal_standing(
        self, store: Store, spool: SQLiteStore
    ) -> None:
        _, summarize, summary = agent(store, spool)
        with store_down(store), store_down(spool), pytest.raises(UnsafeRecompactionError):
            summarize([summary, TURN])
        assert spool.sources(10) == []

    def test_moved_to_the_store_once_it_answers(self, tmp_path: Path, spool: SQLiteStore) -> None:
        """The next decision after the store is back moves the archive and its pointer: another
        process on the same store reads the archive back and takes the pointer for original
        evidence; the spool is left empty, and the pointer is summarized with new turns."""
        store = SQLiteStore(tmp_path / "main.db")
        guard, summarize, summary = agent(store, spool)
        with store_down(store):
            pointer = summarize([summary, TURN])
        [ref] = remedies.pointers(pointer)
        guard.record_source("user: and now?", kind="user_turn")
        later = summarize([pointer, "user: and now?"])
        assert later.startswith("summary: ")  # granted: the pointer is original evidence
        assert spool.sources(10) == []
        pointer_id = guard.text_id(remedies.POINTER_KIND, pointer)
        assert pointer_id in guard.provenance(later).sources  # read as the moved pointer
        assert guard.check([later], summarizer="compact").allowed
        other = Guard(store=SQLiteStore(tmp_path / "main.db"))
        assert other.retrieve(ref) == [summary, TURN]
        region = other.provenance(pointer)
        assert region.depth == 0 and region.source_kinds == {remedies.POINTER_KIND}
        assert other.check(pointer, summarizer="compact").allowed

    def test_nothing_is_written_while_the_store_cannot_be_read(
        self, store: Store, spool: SQLiteStore
    ) -> None:
        """The move follows a read the store answered: with its reads failing, the calls of
        an outage try no write at all (no second failing call per decision)."""
        guard, summarize, summary = agent(store, spool)
        with store_down(store):
            pointer = summarize([summary, TURN])
        reads = [m for m in STORE_METHODS if m not in WRITES]
        with store_down(store, reads), one_fault([store], at=0) as calls:
            for _ in range(3):
                guard.check([pointer], summarizer="compact")
                guard.provenance(pointer)
        assert not set(calls) & set(WRITES)
        assert len(spool.sources(10)) == 2

    def test_a_store_refusing_writes_is_asked_once_per_interval(
        self, store: Store, spool: SQLiteStore
    ) -> None:
        """A store that answers reads but refuses writes (read-only, disk full): the move is
        tried again only after `RETRY_AFTER`, one failing write per interval."""
        clock = [1000.0]
        guard, summarize, summary = agent(store, spool)
        guard._spool._clock = lambda: clock[0]  # type: ignore[union-attr]
        with store_down(store):
            pointer = summarize([summary, TURN])
        with store_down(store, WRITES), one_fault([store], at=0) as calls:
            for _ in range(3):
                guard.check([pointer], summarizer="compact")
            assert sum(c in WRITES for c in calls) == 1
            clock[0] += _spool.RETRY_AFTER / 2
            guard.check([pointer], summarizer="compact")
            assert sum(c in WRITES for c in calls) == 1
            clock[0] += _spool.RETRY_AFTER
            guard.check([pointer], summarizer="compact")
            assert sum(c in WRITES for c in calls) == 2
        clock[0] += _spool.RETRY_AFTER
        guard.check([pointer], summarizer="compact")
        assert spool.sources(10) == []

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_a_move_broken_off_keeps_the_rest_for_later(
        self, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fault at each store call of a move (a store that has seen none of it): whatever
        was not moved stays in the spool and reads back from it, and a later move finishes:
        nothing is lost either way."""
        monkeypatch.setattr(_spool, "RETRY_AFTER", 0.0)
        at, calls = 0, 1
        while at <= calls:  # at 0: a move with no fault, to count its calls
            folder = tmp_path / str(at)
            folder.mkdir()
            store: Any = MemoryStore() if kind == "memory" else SQLiteStore(folder / "main.db")
            spool = SQLiteStore(folder / "spool.db")
            guard, summarize, summary = agent(store, spool)
            with store_down(store):
                pointer = summarize([summary, TURN])
            [ref] = remedies.pointers(pointer)
            with one_fault([store], at) as made:
                guard._spool.move(guard._unspool)  # type: ignore[union-attr]
            if at == 0:
                calls = len(made)
                assert "put_source" in made
            assert guard.retrieve(ref) == [summary, TURN], made
            guard._spool.move(guard._unspool)  # type: ignore[union-attr]
            assert spool.sources(10) == []
            assert Guard(store=store).retrieve(ref) == [summary, TURN]
            spool.close()
            at += 1

    def test_a_long_outage_is_moved_a_batch_a_call(self, store: Store, spool: SQLiteStore) -> None:
        """Twenty remedies during the outage (forty entries): each call after it moves at most
        `BATCH`, and every archive reaches the store."""
        guard, summarize, summary = agent(store, spool)
        with store_down(store):
            pointers = [summarize([summary, f"{TURN} ({n})"]) for n in range(20)]
        refs = [ref for pointer in pointers for ref in remedies.pointers(pointer)]
        assert len(refs) == 20 and len(spool.sources(100)) == 40
        for left in (40 - _spool.BATCH, 40 - 2 * _spool.BATCH, 0, 0):
            guard.check("user: and now?", summarizer="compact")
            assert len(spool.sources(100)) == left
        assert all(store.get_source(ref) is not None for ref in refs)

    def test_a_spool_an_earlier_process_left_is_moved(self, tmp_path: Path, store: Store) -> None:
        """A process that stopped during the outage left archives in its spool: the next guard
        given that spool moves them at its first decision."""
        first = SQLiteStore(tmp_path / "spool.db")
        _, summarize, summary = agent(store, first)
        with store_down(store):
            pointer = summarize([summary, TURN])
        first.close()
        [ref] = remedies.pointers(pointer)
        again = SQLiteStore(tmp_path / "spool.db")
        guard = Guard(store=store, spool=again)
        guard.check("a new turn", summarizer="compact")
        assert again.sources(10) == [] and store.get_source(ref) is not None
        again.close()

    def test_close_moves_all_the_store_takes(self, store: Store, spool: SQLiteStore) -> None:
        """More than a batch: `close` moves them all."""
        guard, summarize, summary = agent(store, spool)
        with store_down(store):
            pointers = [summarize([summary, f"{TURN} ({n})"]) for n in range(20)]
        guard.close()
        assert spool.sources(100) == []
        assert all(store.get_source(remedies.pointers(p)[0]) is not None for p in pointers)

    def test_close_with_the_store_down_says_what_is_left(
        self, store: Store, spool: SQLiteStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        guard, summarize, summary = agent(store, spool)
        with store_down(store), caplog.at_level(logging.WARNING, logger="policyhook"):
            summarize([summary, TURN])
            guard.close()
        assert "the store did not take what the spool holds" in caplog.text
        assert len(spool.sources(10)) == 2


class TestRetrieve:
    def test_a_ref_nowhere_is_a_key_error(self, store: Store, spool: SQLiteStore) -> None:
        guard, _, _ = agent(store, spool)
        with pytest.raises(KeyError, match="offload:0000"):
            guard.retrieve("offload:0000")

    def test_the_store_down_and_the_ref_not_spooled_raises_the_store_s_error(
        self, store: Store, spool: SQLiteStore
    ) -> None:
        """Not a KeyError: the archive may well be in the store; the caller learns why not."""
        guard, _, _ = agent(store, spool)
        with store_down(store), pytest.raises(ConnectionError):
            guard.retrieve("offload:0000")

    def test_the_command_reads_a_spool_file(self, store: Store, spool: SQLiteStore) -> None:
        """An operator reads a spooled archive by hand: `policyhook retrieve REF --store` on the
        spool's file, while the store is down."""
        _, summarize, summary = agent(store, spool)
        with store_down(store):
            [ref] = remedies.pointers(summarize([summary, TURN]))
        command = [POLICYHOOK, "retrieve", ref, "--store", str(spool.path), "--format", "json"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        assert json.loads(out.stdout)["texts"] == [summary, TURN]


def test_the_spool_must_be_another_store() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match='"spool" must be another store'):
        Guard(store=store, spool=store)


class SpoolMachine(RuleBasedStateMachine):
    """An agent's guard over a store that goes down, comes back and fails one call at a time,
    with a spool on disk that outlives restarts: no archive a remedy made is ever lost."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.TemporaryDirectory()
        self.store: Any = MemoryStore()
        self.spool = SQLiteStore(Path(self.folder.name) / "spool.db")
        self.spools = [self.spool]
        self.turns = itertools.count()
        self.archived: dict[str, list[str]] = {}  # ref -> the texts its remedy archived
        self.pointers: list[str] = []  # every remedy's text: original evidence once moved

    @initialize(sqlite=st.booleans())
    def start(self, sqlite: bool) -> None:
        if sqlite:
            self.store = SQLiteStore(Path(self.folder.name) / "main.db")
        self.guard, self.summarize, self.summary = agent(self.store, self.spool)
        self.guard._spool._clock = lambda: math.inf  # type: ignore[union-attr]

    def _remedied(self, outage: Any) -> None:
        region = [self.summary, f"{TURN} ({next(self.turns)})"]
        with outage:
            try:
                text = self.summarize(region)
            except UnsafeRecompactionError:
                return  # the store and the spool both failing: the window kept, nothing lost
        for ref in remedies.pointers(text):
            self.archived[ref] = region
            self.pointers.append(text)

    @rule()
    def remedy_with_the_store_down(self) -> None:
        self._remedied(store_down(self.store))

    @rule(at=st.integers(min_value=1, max_value=30))
    def remedy_with_one_store_call_failing(self, at: int) -> None:
        self._remedied(one_fault([self.store], at))

    @rule(at=st.integers(min_value=0, max_value=10))  # (a decision and a move: a few calls)
    def decide_while_the_store_may_fail(self, at: int) -> None:
        """A decision with the store up, or its `at`-th call failing: it moves the spool, or
        a part of it, or nothing."""
        with one_fault([self.store], at):
            self.guard.check("user: and now?", summarizer="compact")

    @rule()
    def restart(self) -> None:
        """A new process: a new guard over the same store, the spool's file opened again."""
        self.spool.close()
        self.spool = SQLiteStore(Path(self.folder.name) / "spool.db")
        self.spools.append(self.spool)
        self.guard = Guard(store=self.store, spool=self.spool)
        self.guard._spool._clock = lambda: math.inf  # type: ignore[union-attr]
        self.summarize = self.guard(summary_of, summarizer="compact", remedy=True)

    @invariant()
    def every_archive_reads_back(self) -> None:
        for ref, texts in self.archived.items():
            assert self.guard.retrieve(ref) == texts, ref

    def teardown(self) -> None:
        settled = Guard(store=self.store, spool=self.spool)
        for _ in range(len(self.archived) + 1):  # the store up: each decision moves a batch
            settled.check("user: and now?", summarizer="compact")
        assert self.spool.sources(10) == []
        fresh = Guard(store=self.store)  # another process: nothing cached, no spool
        for ref, texts in self.archived.items():  # every archive is in the store now
            assert fresh.retrieve(ref) == texts, ref
        for pointer in self.pointers:  # and every pointer, as original evidence
            assert fresh.provenance(pointer).source_kinds == {remedies.POINTER_KIND}
        for spool in self.spools:
            spool.close()
        if isinstance(self.store, SQLiteStore):
            self.store.close()
        self.folder.cleanup()


SpoolMachine.TestCase.settings = deep.suite(30, 20)
TestSpoolMachine = SpoolMachine.TestCase
