"""A source id names one text: registering another under it is refused, so no summary of the text
an id held is ever allowed on the strength of another text the id holds now.

The property: random sequences of registrations (through the guard or the store; the same text
again, another text, a version id), evictions, texts quoting summaries, summaries and checks,
on MemoryStore (unbounded, and bounded past every bound) and SQLiteStore. Whenever the guard
allows a summary to be summarized again, every id it rests on holds a text it was made from, and
every text it was made from is held under one of those ids. On the code before source ids named
one text, registering `cfg` again with another text made the first check after it fail.
"""

from __future__ import annotations

import itertools
import string
import tempfile
from pathlib import Path

import deep
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from policyhook import (
    Guard,
    Ledger,
    MemoryStore,
    Source,
    SourceIdConflictError,
    SQLiteStore,
    Store,
    UnsafeRecompactionError,
)
from policyhook._provenance import digest, encode

IDS = ["cfg", "doc", "run", "cfg@v2", "doc@v2"]
VARIANTS = ["alpha", "beta", "gamma"]


def text_of(source_id: str, variant: str) -> str:
    """A source text (letters only: the default output check has no number to refuse)."""
    return f"the {source_id.partition('@')[0]} says the ceiling is {variant} for every deploy"


def tag(n: int) -> str:
    out = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        out = string.ascii_lowercase[r] + out
    return out


class SourceIds(RuleBasedStateMachine):
    """Registrations, evictions and summaries against what each id was registered with."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.counter = itertools.count()
        self.names: dict[str, str] = {}  # id -> the one text it was registered with
        self.made: dict[str, frozenset[str]] = {}  # summary or quoting text -> texts under it
        self.summaries: list[str] = []

    @initialize(
        kind=st.sampled_from(["memory", "bounded", "sqlite"]),
        max_texts=st.sampled_from([1, 3, 65_536]),
    )
    def setup(self, kind: str, max_texts: int) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.store: Store = SQLiteStore(Path(self.tmp.name) / "ids.db")
        elif kind == "bounded":  # tombstones forgotten at once, ids soon after
            self.store = MemoryStore(max_sources=2, max_tombstones=0, max_ids=2)
        else:
            self.store = MemoryStore()
        self.guard = Guard(store=self.store, max_texts=max_texts)
        self.summarize = self.guard(self._summary, summarizer="s")

    def _summary(self, value: object) -> str:
        return f"summary {tag(next(self.counter))} of the run"

    def teardown(self) -> None:
        self.guard.close()
        if isinstance(self.store, SQLiteStore):
            self.store.close()
        self.tmp.cleanup()

    def _under(self, text: str) -> frozenset[str]:
        """The source texts `text` was made from (itself, if it is one)."""
        return self.made.get(text, frozenset({text}))

    def _register(self, source_id: str, text: str, through: str) -> bool:
        before = self.store.get_source(source_id)
        try:
            if through == "guard":
                self.guard.record_source(text, "config_read", source_id)
            else:
                self.store.put_source(Source(source_id, "config_read"), text)
        except SourceIdConflictError as exc:
            assert exc.source_id == source_id
            assert self.store.get_source(source_id) == before  # refused: nothing changed
            # Refused only when the id named another text, or (a bounded MemoryStore past
            # max_ids) the store can no longer tell.
            assert self.names.get(source_id, text) != text or self.kind == "bounded"
            return False
        assert self.names.setdefault(source_id, text) == text, "an id took a second text"
        return True

    @rule(
        source_id=st.sampled_from(IDS),
        variant=st.sampled_from(VARIANTS),
        through=st.sampled_from(["guard", "store"]),
    )
    def register(self, source_id: str, variant: str, through: str) -> None:
        self._register(source_id, text_of(source_id, variant), through)

    @precondition(lambda self: self.summaries)
    @rule(source_id=st.sampled_from(IDS), data=st.data())
    def register_quoting(self, source_id: str, data: st.DataObject) -> None:
        """A turn quoting a summary, registered: it rests on the summary's texts and itself."""
        quoted = data.draw(st.sampled_from(self.summaries))
        text = f"the {source_id.partition('@')[0]} turn quotes: {quoted}"
        if self._register(source_id, text, "guard"):
            self.made[text] = self._under(quoted) | {text}

    @rule(source_id=st.sampled_from(IDS))
    def evict(self, source_id: str) -> None:
        self.store.evict(source_id)

    @rule(data=st.data())
    def summarize_some(self, data: st.DataObject) -> None:
        """Summarize source texts (registered or not) and earlier summaries or quoting turns."""
        pool = [text_of(i, v) for i in IDS for v in VARIANTS] + self.summaries + list(self.made)
        value = data.draw(st.lists(st.sampled_from(sorted(set(pool))), min_size=1, max_size=3))
        under = frozenset().union(*(self._under(t) for t in value))
        self._check_allowed(value, under)
        try:
            out = self.summarize(value)
        except UnsafeRecompactionError:
            return
        self.made[out] = under
        self.summaries.append(out)

    @precondition(lambda self: self.summaries)
    @rule(data=st.data())
    def check(self, data: st.DataObject) -> None:
        text = data.draw(st.sampled_from(self.summaries))
        self._check_allowed([text], self._under(text))

    def _check_allowed(self, value: list[str], under: frozenset[str]) -> None:
        """If summarizing `value` again is allowed, it is derivable from what its ids hold."""
        region = self.guard.provenance(value)
        decision = self.guard.check(value, summarizer="s")
        if region.depth == 0 or not decision.allowed:
            return
        held = self.store.get_sources(region.sources)
        assert held.keys() == region.sources, "allowed with a dead source"
        for source_id, text in held.items():
            assert text in under, f"{source_id} holds a text {value} was not made from"
        assert under <= set(held.values()), "allowed, but a text it was made from is gone"


TestSourceIds = SourceIds.TestCase
TestSourceIds.settings = deep.suite(150, 30)


class TestReRegistration:
    """The known gap of docs/provenance.md, step by step, on every process-local store."""

    @pytest.fixture(params=["memory", "sqlite"])
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
        return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.db")

    @pytest.mark.parametrize("evicted_first", [False, True])
    def test_a_changed_file_under_its_old_id_is_refused(
        self, store: Store, evicted_first: bool
    ) -> None:
        """cfg registered with A, summarized; registering B under cfg (directly, or after
        evicting cfg) raises and changes nothing: the summary is allowed while cfg holds A, and
        refused once cfg is evicted. B under a new id is fine."""
        guard = Guard(store=store)
        guard.record_source("retry ceiling seven, from the config file", "config_read", "cfg")
        out = guard(lambda t: "Summary: the retry ceiling is seven.", summarizer="s")(
            "retry ceiling seven, from the config file"
        )
        if evicted_first:
            store.evict("cfg")
        with pytest.raises(SourceIdConflictError, match="'cfg' already names another text"):
            guard.record_source("retry ceiling five, from the config file", "config_read", "cfg")
        assert guard.check(out, summarizer="s").allowed is not evicted_first
        guard.record_source("retry ceiling five, from the config file", "config_read", "cfg@v2")
        if not evicted_first:
            store.evict("cfg")
        assert not guard.check(out, summarizer="s").allowed
        guard.record_source("retry ceiling seven, from the config file", "config_read", "cfg")
        assert guard.check(out, summarizer="s").allowed  # the original is back

    def test_a_quoting_text_under_a_taken_id_writes_nothing(self, store: Store) -> None:
        """A text quoting a summary, registered under an id that names another text: refused
        before its provenance is written, so it is not recognised as resting on that id."""
        guard = Guard(store=store)
        guard.record_source("retry ceiling seven, from the config file", "config_read", "cfg")
        out = guard(lambda t: "Summary: the retry ceiling is seven.", summarizer="s")(
            "retry ceiling seven, from the config file"
        )
        quoting = f"Assistant: as summarized, {out}"
        for state in ("live", "evicted"):
            with pytest.raises(SourceIdConflictError, match=f"now {state}"):
                guard.record_source(quoting, "ai_turn", "cfg")
            key = digest(store.secret(), encode(quoting))
            assert store.lookup([key]) == {}
            store.evict("cfg")
        fresh = Guard(store=store)  # nothing cached: what the store says
        assert fresh.provenance(quoting).id != "cfg"  # not the record of a text held by cfg

    def test_a_race_lost_after_the_check_leaves_the_text_resting_on_no_held_source(
        self, store: Store
    ) -> None:
        """Another process takes the id between the ledger's check and its write: the quoting
        text's record, already written, is made to rest on a source no store holds, so a
        summary of it is never allowed (fail closed), in this process and any other. A
        summary's own text losing the same race keeps its record (plus the id, which only
        makes it stricter): it is derivable from its own sources."""
        ledger = Ledger(store)
        ledger.record_source("retry ceiling seven, from the config file", "config_read", "x")
        region = ledger.resolve(["retry ceiling seven, from the config file"], "w").region
        out = "Summary: the retry ceiling is seven."
        ledger.record_summary(out, region, "w")
        quoting = f"Assistant: as summarized, {out}"
        put = store.put_source
        raced: set[str] = set()

        def racing_put(source: Source, text: str) -> None:
            if source.id not in raced:  # another process gets there first
                raced.add(source.id)
                put(Source(source.id, "config_read"), "another process's text")
            put(source, text)

        store.put_source = racing_put  # type: ignore[method-assign]
        with pytest.raises(SourceIdConflictError):
            ledger.record_source(quoting, "ai_turn", "cfg")
        for reader in (ledger, Ledger(store)):
            found = reader.resolve([quoting], "w")
            assert found.region.depth == 1
            dead = found.region.sources - store.live(found.region.sources)
            assert any(s.startswith("unheld:") for s in dead)
        with pytest.raises(SourceIdConflictError):
            ledger.record_source(out, "ai_turn", "msg")
        assert Ledger(store).resolve([out], "w").region.sources == {"x", "msg"}


class TestIdsTheLibraryChooses:
    """The ids policyhook itself registers texts under never name two texts in normal use."""

    def test_offloading_the_same_window_twice_with_other_pins(self) -> None:
        """A window offloaded again after one more source died gets the same archive ref but a
        pointer pinning fewer facts: the pointer's id is derived from its text, so the
        second offload is not refused (it was `<ref>#pointer` for every pointer of that ref)."""
        from policyhook import remedies

        guard = Guard()
        summarize = guard(
            lambda texts: "Summary: deploy retried, from config.", summarizer="s", remedy=True
        )
        config = "config/agent.yaml: retry_ceiling: 7  # max retries for flaky tool calls"
        turn = "user: also make sure the notification goes to #ops, ticket OPS-4821"
        guard.record_source(config, kind="config_read", source_id="cfg-42")
        guard.record_source(turn, kind="user_turn", source_id="turn-1")
        s1 = summarize([config, turn])
        guard.store.evict("cfg-42")
        first = summarize([s1, "user: status?"])
        guard.store.evict("turn-1")
        second = summarize([s1, "user: status?"])
        assert remedies.pointers(first) == remedies.pointers(second)  # the same archive
        assert first != second and "OPS-4821 [" in first and "OPS-4821 [" not in second
