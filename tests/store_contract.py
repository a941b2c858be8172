"""The Store contract, as tests every store must pass (docs/stores.md says the same in prose).

Use it by subclassing `StoreContract` in a test module and providing two fixtures:

- `make_store(**options)`: a new, empty store (options: `ttl` in seconds; a store without TTL
  support may `pytest.skip`);
- `reopen(store)`: a second handle on the same backing data, as another process would open it
  (for a process-local store, the store itself).

    class TestMyStore(StoreContract):
        @pytest.fixture
        def make_store(self): ...
        @pytest.fixture
        def reopen(self): ...
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyhook import SourceIdConflictError
from policyhook._provenance import (
    Entry,
    Held,
    Source,
    View,
    _takes_held,
    anchor_of,
    digest,
    encode,
)
from policyhook.stores import Store

MakeStore = Callable[..., Store]
Reopen = Callable[[Store], Store]

#: Ids unique per hypothesis example: one store outlives the examples of a test.
_runs = itertools.count()
#: What either handle does in an interleaving: put or evict a source, then read liveness.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put_other", "evict", "evict_other", "view", "view_found", "live"]),
        st.integers(0, 5),
    ),
    max_size=40,
)


def summary(store: Store, text: str, *, window: str = "w", depth: int = 1, **fields: Any) -> Entry:
    """The entry a ledger would write for summary `text` (keyed with the store's secret)."""
    data = encode(text)
    key = store.secret()
    return Entry(
        digest=digest(key, data),
        id=f"s:{digest(key, data)[:16]}",
        depth=depth,
        size=len(data),
        anchor=anchor_of(key, data),
        window=window,
        **fields,
    )


class StoreContract:
    """What the ledger relies on from every store."""

    @pytest.fixture
    def store(self, make_store: MakeStore) -> Store:
        return make_store()

    # -- the secret -----------------------------------------------------------------------------

    def test_secret_is_stable_and_shared(self, store: Store, reopen: Reopen) -> None:
        """The secret is at least 16 random bytes, the same on every call and for every handle."""
        secret = store.secret()
        assert isinstance(secret, bytes) and len(secret) >= 16
        assert store.secret() == secret
        assert reopen(store).secret() == secret

    def test_stores_have_different_secrets(self, make_store: MakeStore) -> None:
        """Two separate stores key their ids differently (a secret is never a constant)."""
        assert make_store().secret() != make_store().secret()

    # -- sources, liveness and tombstones -------------------------------------------------------

    def test_live_is_the_held_subset(self, store: Store) -> None:
        """live() returns exactly the ids the store holds."""
        store.put_source(Source("a", "config_read"), "A")
        store.put_source(Source("b", "user_turn"), "B")
        assert store.live(["a", "b", "c"]) == {"a", "b"}
        assert store.live([]) == frozenset()

    def test_gives_the_original_back(self, store: Store) -> None:
        """get_source returns the text that was put, character for character."""
        text = "retry_ceiling: 7 \u00e9\U0001f600"
        store.put_source(Source("a", "config_read"), text)
        assert store.get_source("a") == text
        assert store.get_source("never") is None

    def test_gives_many_originals_back_in_one_call(self, make_store: MakeStore) -> None:
        """get_sources returns the held texts among the ids asked, exactly; evicted, expired and
        unknown ids are left out (what an output check reads about a whole input at once)."""
        # A TTL the 300 puts outlast even on a loaded machine (at 0.3 s, PostgreSQL's first
        # sources expired before the lookup under a load average of 5).
        store = make_store(ttl=2.0)
        texts = {f"s{i}": f"source {i}: retry_ceiling = {i} \u00e9\U0001f600" for i in range(300)}
        for source_id, text in texts.items():
            store.put_source(Source(source_id, "tool_output"), text)
        store.evict("s7")
        asked = [*texts, "never"]
        assert store.get_sources(asked) == {k: v for k, v in texts.items() if k != "s7"}
        assert store.get_sources([]) == {}
        time.sleep(2.1)
        store.put_source(Source("late", "tool_output"), "late")
        assert store.get_sources(["s1", "late"]) == {"late": "late"}

    def test_eviction_leaves_a_tombstone(self, store: Store) -> None:
        """An evicted source is dead and known; an id never put is unknown (absent)."""
        store.put_source(Source("a", "config_read"), "A")
        store.put_source(Source("b", "config_read"), "B")
        assert store.evict("a") is True
        assert store.evict("a") is False
        assert store.evict("never") is False
        assert store.live(["a", "b"]) == {"b"}
        assert store.get_source("a") is None
        assert store.states(["a", "b", "never"]) == {"a": "evicted", "b": "live"}
        assert store.states([]) == {}

    def test_evicted_text_is_still_known_by_digest(self, store: Store) -> None:
        """Eviction drops the text, not the knowledge: the entry is still found by digest."""
        store.put_source(Source("a", "config_read"), "the retry ceiling is 7")
        store.evict("a")
        key = digest(store.secret(), encode("the retry ceiling is 7"))
        assert store.lookup([key])[key].id == "a"

    def test_re_putting_the_same_text_revives(self, store: Store, reopen: Reopen) -> None:
        """Putting an evicted id again with its text makes it live again, through any handle:
        the original is back."""
        store.put_source(Source("a", "config_read"), "the retry ceiling is 7")
        store.put_source(Source("a", "config_read"), "the retry ceiling is 7")  # held: no-op
        store.evict("a")
        reopen(store).put_source(Source("a", "config_read"), "the retry ceiling is 7")
        assert store.states(["a"]) == {"a": "live"}
        assert store.get_source("a") == "the retry ceiling is 7"

    @pytest.mark.parametrize("state", ["live", "evicted"])
    def test_another_text_under_a_known_id_is_refused(
        self, store: Store, reopen: Reopen, state: str
    ) -> None:
        """A source id names one text: another text under an id the store holds or has evicted
        raises SourceIdConflictError (a ValueError naming the id and the way forward), through
        any handle, and changes nothing (the id's state and text, the new text unknown)."""
        store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        if state == "evicted":
            store.evict("cfg")
        for handle in (store, reopen(store)):
            with pytest.raises(SourceIdConflictError) as raised:
                handle.put_source(Source("cfg", "config_read"), "retry_ceiling: 5")
            assert isinstance(raised.value, ValueError) and raised.value.source_id == "cfg"
            message = str(raised.value)
            assert f"'cfg' already names another text (now {state})" in message
            assert "new id" in message and "leave source_id out" in message
        assert store.states(["cfg"]) == {"cfg": state}
        assert store.get_source("cfg") == ("retry_ceiling: 7" if state == "live" else None)
        assert list(store.lookup([digest(store.secret(), b"retry_ceiling: 5")])) == []

    def test_another_text_under_an_expired_id_is_refused(self, make_store: MakeStore) -> None:
        """An expired id names its text too: another is refused, the same one revives it."""
        store = make_store(ttl=0.3)
        store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        time.sleep(0.4)
        with pytest.raises(SourceIdConflictError, match=r"'cfg' .*\(now expired\)"):
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 5")
        assert store.states(["cfg"]) == {"cfg": "expired"}
        store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        assert store.get_source("cfg") == "retry_ceiling: 7"

    def test_one_text_under_several_ids(self, store: Store) -> None:
        """The same text may be held under several ids: each id still names one text."""
        store.put_source(Source("a", "config_read"), "retry_ceiling: 7")
        store.put_source(Source("b", "config_read"), "retry_ceiling: 7")
        store.evict("a")
        assert store.get_source("b") == "retry_ceiling: 7"
        store.put_source(Source("a", "config_read"), "retry_ceiling: 7")
        assert store.live(["a", "b"]) == {"a", "b"}

    def test_racing_texts_under_one_id_one_wins(self, store: Store, reopen: Reopen) -> None:
        """Eight handles (threads, or processes' connections) putting eight texts under one new
        id at once: exactly one wins, the others are refused, and the store holds the winner's."""
        handles = [store, *(reopen(store) for _ in range(7))]
        run = next(_runs)
        won: list[str] = []
        refused: list[BaseException] = []
        start = threading.Barrier(len(handles))

        def put(n: int) -> None:
            text = f"text {n} of race {run}"
            start.wait()
            try:
                handles[n].put_source(Source(f"race-{run}", "config_read"), text)
                won.append(text)
            except SourceIdConflictError as exc:
                refused.append(exc)

        threads = [threading.Thread(target=put, args=(n,)) for n in range(len(handles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == len(handles) - 1
        assert store.get_source(f"race-{run}") == won[0]

    def test_ttl_expires_sources(self, make_store: MakeStore) -> None:
        """A source older than the store's TTL is dead (through `live` and `view`, whatever
        they cached) and known as expired."""
        store = make_store(ttl=0.2)
        store.put_source(Source("a", "tool_output"), "A")
        assert store.live(["a"]) == {"a"}
        assert store.view(0, 1, [], ["a"]).live == {"a"}  # (a cache now holds its expiry)
        time.sleep(0.3)
        store.put_source(Source("b", "tool_output"), "B")
        assert store.live(["a", "b"]) == {"b"}
        assert store.view(0, 1, [], ["a", "b"]).live == {"b"}
        assert store.states(["a", "b"]) == {"a": "expired", "b": "live"}
        assert store.get_source("a") is None
        assert store.evict("a") is False

    def test_liveness_of_many_ids_in_one_call(self, store: Store) -> None:
        """live() and states() answer for 2,000 ids at once (half held, half evicted)."""
        for i in range(2000):
            store.put_source(Source(f"s{i}", "tool_output"), f"text {i}")
        for i in range(0, 2000, 2):
            store.evict(f"s{i}")
        ids = [f"s{i}" for i in range(2000)] + ["unknown"]
        assert store.live(ids) == {f"s{i}" for i in range(1, 2000, 2)}
        states = store.states(ids)
        assert len(states) == 2000 and "unknown" not in states
        assert states["s0"] == "evicted" and states["s1"] == "live"

    # -- the text index -------------------------------------------------------------------------

    def test_lookup_finds_sources_by_keyed_digest(self, store: Store) -> None:
        """A source's text is found by its keyed digest, with id, kind, size and anchor."""
        text = "config: retry_ceiling = 7 for deploys"
        store.put_source(Source("cfg", "config_read"), text)
        data = encode(text)
        key = digest(store.secret(), data)
        entry = store.lookup([key, "0" * 32])[key]
        assert (entry.id, entry.depth, entry.kind, entry.size) == (
            "cfg",
            0,
            "config_read",
            len(data),
        )
        assert entry.sources == ("cfg",)
        assert entry.anchor == anchor_of(store.secret(), data)
        assert store.lookup([]) == {}
        assert list(store.lookup(["0" * 32])) == []

    def test_summaries_are_found_by_digest_and_anchor(self, store: Store) -> None:
        """A summary's entry comes back whole by digest, and by its anchor."""
        entry = summary(
            store,
            "Summary: retry ceiling is 7, from config.",
            sources=("cfg",),
            source_kinds=("config_read",),
        )
        store.put_summary(entry, "Summary: retry ceiling is 7, from config.")
        assert store.lookup([entry.digest]) == {entry.digest: entry}
        assert entry.anchor is not None
        assert store.by_anchor([entry.anchor, "f" * 16]) == [entry]
        assert store.by_anchor([]) == []

    def test_short_texts_have_no_anchor(self, store: Store) -> None:
        """A text shorter than the anchor is found whole only: no anchor is indexed."""
        store.put_source(Source("a", "user_turn"), "ok")
        key = digest(store.secret(), b"ok")
        assert store.lookup([key])[key].anchor is None

    def test_summaries_are_normalised(self, store: Store) -> None:
        """A rolling chain stores one parent link per summary; rests_on walks the whole chain."""
        parent: tuple[str, ...] = ()
        ids = []
        for i in range(300):
            entry = summary(
                store,
                f"rolling summary number {i}",
                depth=i + 1,
                parents=parent,
                sources=(f"turn{i}",),
                source_kinds=("user_turn",),
            )
            store.put_summary(entry, f"rolling summary number {i}")
            parent = (entry.id,)
            ids.append(entry.id)
        got = store.rests_on([ids[-1], ids[0], "s:unknown"])
        assert got[ids[-1]] == {f"turn{i}" for i in range(300)}
        assert got[ids[0]] == {"turn0"}
        assert got["s:unknown"] == frozenset()
        assert store.lookup([summary(store, "rolling summary number 299").digest]).popitem()[
            1
        ].sources == ("turn299",)

    def test_rests_on_follows_diamonds_once(self, store: Store) -> None:
        """Parents shared by several summaries are followed once; the union is exact."""
        a = summary(store, "summary a of the config", sources=("x",))
        b = summary(store, "summary b of the turns", sources=("y",))
        c = summary(store, "merge of a and b summaries", depth=2, parents=(a.id, b.id))
        d = summary(store, "merge of c and a again", depth=3, parents=(c.id, a.id), sources=("z",))
        for e, t in [
            (a, "summary a of the config"),
            (b, "summary b of the turns"),
            (c, "merge of a and b summaries"),
            (d, "merge of c and a again"),
        ]:
            store.put_summary(e, t)
        assert store.rests_on([d.id, c.id]) == {d.id: {"x", "y", "z"}, c.id: {"x", "y"}}
        assert store.rests_on([]) == {}

    def test_recording_a_text_again_only_grows_its_provenance(self, store: Store) -> None:
        """The same summary text recorded twice keeps both records' parents and sources and the
        deeper depth; a self-reference is dropped. put_summary returns what it stored (or None)."""
        a = summary(store, "parent summary of the config", sources=("cfg",))
        store.put_summary(a, "parent summary of the config")
        first = summary(store, "the same output text twice", parents=(a.id,), sources=("t1",))
        assert store.put_summary(first, "the same output text twice") in (first, None)
        again = summary(
            store, "the same output text twice", depth=3, parents=(first.id,), sources=("t2",)
        )
        store.put_summary(again, "the same output text twice")
        stored = store.lookup([first.digest])[first.digest]
        assert (stored.depth, stored.parents, stored.sources) == (3, (a.id,), ("t1", "t2"))
        assert store.lookup([first.digest])[first.digest] == stored
        assert store.rests_on([first.id]) == {first.id: {"cfg", "t1", "t2"}}

    def test_putting_a_summarys_text_as_a_source_keeps_the_summary(
        self, store: Store, reopen: Reopen
    ) -> None:
        """A summary's text put again as a source (an adapter archiving every message) is held
        under the source's id, and its entry stays the summary's: never plain evidence, or a
        summary of dead sources would pass for an original once the ledger's second write (its
        provenance over the source) fails."""
        text = "Summary: the retry ceiling is seven, from config."
        entry = summary(store, text, sources=("cfg",))
        store.put_summary(entry, text)
        store.put_source(Source("msg-1", "ai_turn"), text)
        assert store.get_source("msg-1") == text
        for handle in (store, reopen(store)):
            kept = handle.lookup([entry.digest])[entry.digest]
            assert (kept.id, kept.depth, kept.sources) == (entry.id, 1, ("cfg",))
            assert handle.rests_on([entry.id]) == {entry.id: {"cfg"}}
            assert [e.id for e in handle.by_anchor([entry.anchor or ""])] == [entry.id]

    def test_a_text_recorded_as_a_summary_keeps_the_id_others_rest_on(
        self, store: Store, reopen: Reopen
    ) -> None:
        """A registered text that quotes a summary has an entry under its source's id; another
        summary may rest on it by that id. Recorded later as a summary itself, its entry keeps
        that id (merged): were the id replaced by the summary's, what rests on it would lose the
        source (rests_on) in every process, and be allowed once that source is gone."""
        quoted = summary(store, "the quoted summary of the config", sources=("cfg",))
        store.put_summary(quoted, "the quoted summary of the config")
        text = "quoting: the quoted summary of the config, and the deploy notes"
        carried = summary(store, text, parents=(quoted.id,), sources=("src6",))
        carried = replace(carried, id="src6", kind="tool_output", source_kinds=("tool_output",))
        store.put_summary(carried, text)
        store.put_source(Source("src6", "tool_output"), text)
        on_it = summary(store, "a summary of the quoting text", depth=2, parents=("src6",))
        store.put_summary(on_it, "a summary of the quoting text")
        store.put_summary(summary(store, text, sources=("base",)), text)  # the same text again
        for handle in (store, reopen(store)):
            kept = handle.lookup([carried.digest])[carried.digest]
            assert (kept.id, kept.depth) == ("src6", 1)
            assert set(kept.sources) == {"base", "src6"}
            assert handle.rests_on([on_it.id]) == {on_it.id: {"cfg", "base", "src6"}}

    def test_window_depth_is_the_deepest_recorded(self, store: Store) -> None:
        """window_depth is the deepest summary recorded in that window, 0 for others."""
        for depth, text in [
            (1, "first summary of w"),
            (3, "third summary of w"),
            (2, "second summary of w"),
        ]:
            store.put_summary(summary(store, text, depth=depth), text)
        assert store.window_depth("w") == 3
        assert store.window_depth("other") == 0

    def test_summaries_per_window_in_order(self, store: Store) -> None:
        """summaries() returns a window's most recent summaries, oldest first, with provenance."""
        parent: tuple[str, ...] = ()
        for i in range(3):
            entry = summary(
                store,
                f"text {i} of w",
                depth=i + 1,
                parents=parent,
                sources=(f"t{i}",),
                source_kinds=("user_turn",),
            )
            store.put_summary(entry, f"text {i} of w")
            parent = (entry.id,)
        store.put_summary(summary(store, "other text", window="other"), "other text")
        got = store.summaries("w", 2)
        assert [(r.depth, t) for r, t in got] == [(2, "text 1 of w"), (3, "text 2 of w")]
        assert got[1][0].sources == {"t0", "t1", "t2"}
        assert got[1][0].source_kinds == {"user_turn"}

    # -- per-fact provenance --------------------------------------------------------------------

    def test_fact_provenance_is_recorded_with_the_summary(self, store: Store) -> None:
        """put_summary(facts=) keeps each fact with the sources stating it; facts() gives them
        back for any number of summaries in one call, leaving out summaries with none."""
        a = summary(store, "retry ceiling is 7, timeout 30s")
        b = summary(store, "the deploy used v1.4.2 \u00e9")
        store.put_summary(a, "retry ceiling is 7, timeout 30s", [("n:7", ("cfg", "turn-1"))])
        store.put_summary(
            b,
            "the deploy used v1.4.2 \u00e9",
            [("v:1.4.2 \u00e9\U0001f600", ("t\u00e9",)), ("x", ())],
        )
        store.put_summary(summary(store, "no facts in this one"), "no facts in this one")
        got = store.facts([a.id, b.id, summary(store, "no facts in this one").id, "s:unknown"])
        assert {k: dict(v) for k, v in got.items()} == {  # a fact with no source: nothing kept
            a.id: {"n:7": ("cfg", "turn-1")},
            b.id: {"v:1.4.2 \u00e9\U0001f600": ("t\u00e9",)},
        }
        assert store.facts([]) == {}

    def test_fact_provenance_only_grows(self, store: Store) -> None:
        """The same summary recorded again adds facts and sources; none is lost, none doubled."""
        entry = summary(store, "the retry ceiling is 7")
        store.put_summary(entry, "the retry ceiling is 7", [("n:7", ("cfg",)), ("p:a", ("x",))])
        store.put_summary(entry, "the retry ceiling is 7", [("n:7", ("cfg", "doc")), ("q", ("y",))])
        store.put_summary(entry, "the retry ceiling is 7")  # no facts: keeps what it had
        assert dict(store.facts([entry.id])[entry.id]) == {
            "n:7": ("cfg", "doc"),
            "p:a": ("x",),
            "q": ("y",),
        }

    def test_fact_provenance_is_shared_and_outlives_eviction(
        self, store: Store, reopen: Reopen
    ) -> None:
        """Another handle reads the facts one handle recorded; evicting a source keeps the
        record (the fact is then stated only by a dead source: unverifiable, not unknown)."""
        store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        entry = summary(store, "retries are capped at 7", sources=("cfg",))
        store.put_summary(entry, "retries are capped at 7", [("n:7", ("cfg",))])
        other = reopen(store)
        assert other.evict("cfg") is True
        assert dict(other.facts([entry.id])[entry.id]) == {"n:7": ("cfg",)}
        assert dict(store.facts([entry.id])[entry.id]) == {"n:7": ("cfg",)}
        assert store.live(["cfg"]) == frozenset()

    # -- a decision's reads at once --------------------------------------------------------------

    def test_view_is_since_lookup_closures_liveness_and_depth(self, store: Store) -> None:
        """view() answers what since, lookup, rests_on, live and window_depth would."""
        store.put_source(Source("a", "config_read"), "source text a")
        store.put_source(Source("b", "user_turn"), "source text b")
        store.put_source(Source("c", "tool_output"), "source text c")
        store.evict("c")
        s1 = summary(store, "first summary text", sources=("a", "c"))
        store.put_summary(s1, "first summary text")
        s2 = summary(store, "second summary text", depth=2, parents=(s1.id,), sources=("b",))
        store.put_summary(s2, "second summary text")
        b = digest(store.secret(), encode("source text b"))
        view = store.view(0, 100, [s2.digest, b, "0" * 32], ["x", "a"], "w")
        assert [(e.id, t) for e, t in view.since] == [
            ("a", "source text a"),
            ("b", "source text b"),
            ("c", None),
            (s1.id, "first summary text"),
            (s2.id, "second summary text"),
        ]
        assert view.entries == {s2.digest: s2, b: store.lookup([b])[b]}
        assert view.rests_on == {s2.id: {"a", "b", "c"}}
        assert view.live == {"a", "b"}  # x unknown, c evicted: neither held
        assert view.asked(["x", "a"]) == {"x", "a", "b", "c"}
        assert view.depth == 2
        assert store.view(view.cursor, 100, [], [], None) == type(view)(
            view.cursor, [], {}, {}, frozenset(), None
        )

    def test_view_of_many_sources_pages_since(self, store: Store) -> None:
        """Liveness of 2,000 ids in one view; since stops at the limit and the cursor resumes."""
        for i in range(2000):
            store.put_source(Source(f"s{i}", "tool_output"), f"text {i}")
        for i in range(0, 2000, 2):
            store.evict(f"s{i}")
        view = store.view(0, 1500, [], [f"s{i}" for i in range(2000)], "nowhere")
        assert view.live == {f"s{i}" for i in range(1, 2000, 2)}
        assert len(view.since) == 1500 and view.depth == 0
        rest = store.view(view.cursor, 1500, [], [])
        assert len(rest.since) == 500 and rest.depth is None

    # -- catching up ----------------------------------------------------------------------------

    def test_since_pages_through_every_entry_in_order(self, store: Store) -> None:
        """since() gives every entry once, oldest first, with texts still held."""
        store.put_source(Source("a", "config_read"), "source text a")
        store.put_source(Source("b", "config_read"), "source text b")
        store.evict("b")
        store.put_summary(summary(store, "summary text c"), "summary text c")
        cursor, first = store.since(0, 2)
        assert [(e.id, t) for e, t in first] == [("a", "source text a"), ("b", None)]
        cursor, rest = store.since(cursor, 10)
        assert [(e.depth, t) for e, t in rest] == [(1, "summary text c")]
        assert store.since(cursor, 10) == (cursor, [])

    def test_since_sees_another_handles_writes(self, store: Store, reopen: Reopen) -> None:
        """Entries written through another handle (another process) show up in since()."""
        cursor, _ = store.since(0, 100)
        assert store.since(cursor, 100)[1] == []
        other = reopen(store)
        other.put_summary(
            summary(other, "written by the other process"), "written by the other process"
        )
        cursor, got = store.since(cursor, 100)
        assert [t for _, t in got] == ["written by the other process"]
        assert store.since(cursor, 100)[1] == []

    def test_a_view_given_what_was_held_sees_every_death_since(
        self, store: Store, reopen: Reopen
    ) -> None:
        """(Optional: for a store offering `View.as_of` and `held`.) A view given `Held`
        from an all-held answer answers as the full check after another handle's eviction,
        a revival and a put; a store without it is checked in full by the ledger."""
        ids = [f"held-{i}" for i in range(6)]
        for i in ids[:5]:
            store.put_source(Source(i, "tool_output"), f"the held text {i}")
        first = store.view(0, 100, [], frozenset(ids[:5]))
        assert first.live == set(ids[:5])
        offers = first.as_of is not None and _takes_held(store)
        held = Held(frozenset(ids[:5]), first.as_of, frozenset({"held-5"}))
        viewing: Any = store.view

        def view_of(cursor: int) -> View:
            if offers:
                return viewing(cursor, 100, [], frozenset(ids), held=held)  # type: ignore[no-any-return]
            return store.view(cursor, 100, [], frozenset(ids))  # what the ledger does then

        other = reopen(store)
        other.evict("held-2")
        other.evict("held-3")
        other.put_source(Source("held-3", "tool_output"), "the held text held-3")
        store.put_source(Source("held-5", "tool_output"), "the held text held-5")
        view = view_of(first.cursor)
        assert view.live == set(ids) - {"held-2"} == store.live(ids)
        other.evict("held-4")
        again = view_of(view.cursor)
        assert again.live == set(ids) - {"held-2", "held-4"} == store.live(ids)

    def test_another_handle_sees_eviction(self, store: Store, reopen: Reopen) -> None:
        """An eviction through one handle is a tombstone for every handle."""
        store.put_source(Source("a", "config_read"), "A")
        reopen(store).evict("a")
        assert store.states(["a"]) == {"a": "evicted"}

    @settings(  # one contract run for every store class: its executors differ by design
        max_examples=40,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(ops=_OPS)
    def test_liveness_is_never_stale_whatever_the_interleaving(
        self, store: Store, reopen: Reopen, ops: list[tuple[str, int]]
    ) -> None:
        """Liveness read through this handle (`view`, with or without a found summary, and
        `live`) is what was put and not evicted through either handle, in any order: whatever a
        store caches, it never serves a stale "live" (nor a stale "dead")."""
        other = reopen(store)
        run = next(_runs)
        ids = [f"h{run}-{i}" for i in range(6)]
        held: set[str] = set()
        text = f"a summary resting on the first three ids of run {run}"
        entry = summary(store, text, sources=tuple(ids[:3]))
        store.put_summary(entry, text)
        for op, i in ops:
            if op in ("put", "put_other"):
                (store if op == "put" else other).put_source(Source(ids[i], "t"), f"text {i}")
                held.add(ids[i])
            elif op in ("evict", "evict_other"):
                (store if op == "evict" else other).evict(ids[i])
                held.discard(ids[i])
            elif op == "live":
                assert store.live(ids[i:]) == held & set(ids[i:])
            else:
                asked = ids[i:]
                found = [entry.digest] if op == "view_found" else []
                view = store.view(0, 1, found, asked)
                expected = set(asked) | (set(ids[:3]) if found else set())
                assert view.live == held & expected, (op, i)

    # -- threads --------------------------------------------------------------------------------

    def test_concurrent_threads(self, store: Store) -> None:
        """Eight threads putting, checking, evicting and recording lose nothing, raise nothing."""
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(100):
                    store.put_source(Source(f"{n}-{i}", "tool_output"), f"text {n} {i}")
                    assert store.live([f"{n}-{i}"]) == {f"{n}-{i}"}
                    if i % 2:
                        store.evict(f"{n}-{i}")
                    if i % 10 == 0:
                        text = f"summary {n} {i} of the work"
                        store.put_summary(summary(store, text, window=f"w{n}"), text)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        ids = [f"{n}-{i}" for n in range(8) for i in range(100)]
        assert len(store.live(ids)) == 8 * 50
        assert all(store.window_depth(f"w{n}") == 1 for n in range(8))
        _, entries = store.since(0, 10_000)
        assert len(entries) == 8 * 100 + 8 * 10
