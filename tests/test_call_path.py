"""The guarded call's data path, where it was made leaner (branch call5): each shortcut gives
exactly what the longer way gave."""

from __future__ import annotations

from typing import Any

import pytest

from policyhook._activation import INT64_MAX, INT64_MIN, Activation
from policyhook._closures import CLOSURE_IDS, Closures
from policyhook._provenance import Ledger, Region, digest, encode
from policyhook.stores import MemoryStore


def _held(closures: Closures) -> int:
    return sum(len(ids) for ids in closures._older.values())


class TestClosuresCounted:
    """`Closures.put` drops older closures inline (no `_drop_older` call per record): the ids
    they hold are still counted exactly."""

    def test_records_made_from_older_closures_keep_the_count(self) -> None:
        """Records whose parents are older closures (moved out), the newest displaced into the
        older ones, a summary put again that is an older one: `_ids` is what they hold."""
        closures = Closures()
        for i in range(40):
            closures.put(f"s{i}", frozenset(f"{i}:{j}" for j in range(5 + i % 3)))
        assert closures._ids == _held(closures)
        for i in range(40, 80):
            parents = (f"s{i - 30}", f"s{i - 31}", f"s{i - 1}")
            closures.put(f"s{i}", frozenset(f"{i}:{j}" for j in range(7)), parents)
            assert closures._ids == _held(closures)
            assert all(p not in closures._older for p in parents)
        closures.put("s5", frozenset({"again"}))  # an older one becomes the newest
        assert closures._ids == _held(closures) and "s5" not in closures._older
        assert closures.get("s5") == frozenset({"again"})

    def test_the_bound_holds_with_parents(self) -> None:
        """Many large closures, each recorded from the one before: within `CLOSURE_IDS`."""
        closures = Closures()
        big = 1000
        for i in range(3 * CLOSURE_IDS // big):
            parents = (f"s{i - 2}",) if i >= 2 else ()
            closures.put(f"s{i}", frozenset(f"{i}:{j}" for j in range(big)), parents)
            assert closures._ids == _held(closures) <= CLOSURE_IDS


class TestAllHeldOnlyForLargeRegions:
    """`Ledger._seen` keeps where a region's sources were all held only from `_HELD_FROM`
    sources, tested on the view's answer first: the same condition as before."""

    def _ledger_with(self, count: int) -> tuple[Ledger, str]:
        ledger = Ledger(MemoryStore())
        texts = [f"source text number {i} with enough words to be indexed" for i in range(count)]
        for i, text in enumerate(texts):
            ledger.record_source(text, "tool_output", f"src{i}")
        summary = "a summary of them all, long enough to be found inside a longer input"
        parts = [Region.of_source(_source(i)) for i in range(count)]
        ledger.record_summary(summary, Region.merge(parts, "r:all"), "w")
        return ledger, summary

    @pytest.mark.parametrize(("count", "kept"), [(255, False), (256, True), (300, True)])
    def test_kept_from_the_threshold(self, count: int, kept: bool) -> None:
        """255 sources: not kept; 256 and more, all held: kept, with the region's own set."""
        ledger, summary = self._ledger_with(count)
        region = ledger.resolve(summary, "w").region
        assert len(region.sources) == count
        if kept:
            assert ledger._all_held is not None and ledger._all_held[0] == region.id
        else:
            assert ledger._all_held is None

    def test_not_kept_when_one_is_dead(self) -> None:
        """300 sources, one evicted: the view holds 299 of 300, nothing is kept."""
        ledger, summary = self._ledger_with(300)
        ledger.store.evict("src7")
        region = ledger.resolve(summary, "w").region
        assert len(region.sources) == 300
        assert ledger._all_held is None


def _source(i: int) -> Any:
    from policyhook._provenance import Source

    return Source(f"src{i}", "tool_output")


class TestScalarRange:
    """`Activation` tests every int in one expression (`0 <= a | b | ... <= INT64_MAX`); what
    it leaves to `_scalar_problem` (a negative value) is decided there, exactly."""

    def _activation(self, **ints: int) -> Activation:
        fields: dict[str, Any] = {
            "tokens": 1,
            "attempt": 1,
            "window_tokens": 0,
            "window_budget": 0,
            "window_max_depth": 1,
        }
        fields.update(ints)
        depth, chars = ints.get("depth", 1), ints.get("chars", 4)
        region = Region("r:x", depth, frozenset({"a"}), frozenset({"k"}), chars)
        return Activation(
            region,
            frozenset(),
            fields["tokens"],
            "automatic",
            0.5,
            fields["attempt"],
            "w",
            fields["window_tokens"],
            fields["window_budget"],
            fields["window_max_depth"],
            "s",
            False,
            False,
        )

    @pytest.mark.parametrize(
        ("ints", "problem"),
        [
            ({}, None),
            ({"window_tokens": INT64_MAX}, None),
            ({"window_tokens": -1}, None),  # within CEL's int: no problem, however it is found
            ({"attempt": INT64_MIN}, None),
            ({"window_budget": INT64_MAX + 1}, "window.budget is"),
            ({"tokens": INT64_MIN - 1}, "region.tokens is"),
            ({"chars": -(2**70)}, "region.chars is"),
            ({"depth": 2**64 + 1}, "region.depth is"),
        ],
    )
    def test_each_int_checked(self, ints: dict[str, int], problem: str | None) -> None:
        activation = self._activation(**ints)
        if problem is None:
            assert activation.problem is None
        else:
            assert activation.problem is not None and activation.problem.startswith(problem)


class TestDigestsFromTheKeyedHash:
    """The ledger hashes from its hash keyed once (`Ledger._digest`): the same digests as the
    store's `digest(secret, data)`, stripped forms too."""

    @pytest.mark.parametrize(
        "text", ["plain", "trailing  \n", "  leading", "  both \t", "ünïcode tail \n", ""]
    )
    def test_message_digests(self, text: str) -> None:
        store = MemoryStore()
        ledger = Ledger(store)
        key = store.secret()
        whole, bare = ledger._message_digests(text, encode(text))
        assert whole == digest(key, encode(text))
        stripped = text.strip()
        assert bare == (None if stripped == text else digest(key, encode(stripped)))

    def test_region_ids_as_before(self) -> None:
        """A region's id is still the store-keyed digest of its parts' digests joined."""
        store = MemoryStore()
        ledger = Ledger(store)
        key = store.secret()
        parts = ["first message of the input", "second message, new too"]
        region = ledger.resolve(parts, "w").region
        joined = "\x1e".join(digest(key, encode(p)) for p in parts)
        assert region.id == "r:" + digest(key, joined.encode())[:16]
