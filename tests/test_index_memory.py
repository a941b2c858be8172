"""What the ledger remembers for the next input stays bounded however large inputs are: the
splits of messages (`_SPLIT_PLACES` known texts found in them in all) and the source sets of
summaries (`CLOSURE_IDS` ids in all), and what is remembered within the bounds still gives
what a ledger remembering nothing gives."""

from __future__ import annotations

from unittest import mock

from policyhook import _provenance
from policyhook._closures import CLOSURE_IDS, Closures
from policyhook._provenance import _SPLIT_PLACES, Ledger, Region
from policyhook.stores import MemoryStore


def _summaries(ledger: Ledger, count: int) -> list[str]:
    texts = [
        f"summary {i}: the deploy window closed at {i} and the jitter was {i} ms"
        for i in range(count)
    ]
    for i, text in enumerate(texts):
        ledger.record_summary(text, Region(f"r{i}", sources=frozenset({f"src{i}"})), "w")
    return texts


class TestSplitsRemembered:
    def test_long_strings_holding_many_known_texts_are_remembered_within_the_bound(self) -> None:
        """Strings each holding more known texts than a fiftieth of the bound, resolved in turn
        and again: the places remembered never pass `_SPLIT_PLACES`, their count is the sum of
        what is held (the second time through with a summary recorded before each), and each
        resolve names the sources a ledger resolving it first names."""
        ledger = Ledger(MemoryStore())
        texts = _summaries(ledger, 200)
        strings = [
            "\n".join(f"turn {n}.{i} words\n{texts[(n + 7 * i) % 200]}" for i in range(150))
            for n in range(60)
        ]
        for n, value in enumerate(strings + strings[::-1]):
            if n >= len(strings):  # the splits kept are brought up to date, not made again
                ledger.record_summary(f"a new output {n} that no string holds", Region("o"), "w")
            got = ledger.resolve(value, "w").region
            held = sum(len(split[3]) for split in ledger._splits.values())
            assert ledger._split_places == held <= _SPLIT_PLACES
            fresh = Ledger(ledger.store).resolve(value, "w").region
            assert got.sources == fresh.sources and got.depth == fresh.depth == 1

    def test_a_split_larger_than_the_bound_is_not_kept(self) -> None:
        """A string holding more known texts than the bound: resolved right, not remembered."""
        ledger = Ledger(MemoryStore())
        texts = _summaries(ledger, 40)
        value = "\n".join(texts * 3)
        with mock.patch.object(_provenance, "_SPLIT_PLACES", 100):
            for _ in range(2):
                region = ledger.resolve(value, "w").region
                assert region.sources == {f"src{i}" for i in range(40)}
                assert ledger._split_places == 0 and not ledger._splits


class TestClosuresKept:
    def test_the_ids_held_stay_within_the_bound(self) -> None:
        """Closures of many ids each: the older ones hold at most `CLOSURE_IDS` ids, counted
        exactly through puts, pops and drops; the newest is still given back."""
        closures = Closures()
        big = 1000
        for i in range(3 * CLOSURE_IDS // big):
            closures.put(f"s{i}", frozenset(f"{i}:{j}" for j in range(big)))
            if i % 7 == 0:
                closures.pop(f"s{i - 3}")
            held = sum(len(ids) for ids in closures._older.values())
            assert closures._ids == held <= CLOSURE_IDS
        last = 3 * CLOSURE_IDS // big - 1
        assert closures.get(f"s{last}") == frozenset(f"{last}:{j}" for j in range(big))
        closures.drop_unanchored()
        closures.clear()
        assert closures._ids == 0 and len(closures) == 0

    def test_a_thousand_summaries_in_one_string_are_not_walked_again(self) -> None:
        """A string holding a thousand cached summaries, resolved twice: the second resolve
        walks none of them (their closures are kept)."""
        ledger = Ledger(MemoryStore())
        texts = _summaries(ledger, 1000)
        value = "\n".join(f"turn {i} words\n{text}" for i, text in enumerate(texts))
        assert len(ledger.resolve(value, "w").region.sources) == 1000 + 1000
        walked = []
        real = Ledger._walk

        def counting(self: Ledger, entry: object) -> object:
            walked.append(entry)
            return real(self, entry)  # type: ignore[arg-type]

        with mock.patch.object(Ledger, "_walk", counting):
            again = ledger.resolve(value + "\nmore", "w").region
        assert len(again.sources) == 1000 + 1001 and walked == []
