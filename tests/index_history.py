"""An index's life replayed against brute force: the oracle the `policyhook._index` property
tests share (`tests/test_provenance.py`, `tests/test_index_searcher.py`,
`tests/test_index_added.py`, `tests/test_index_chunks.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from policyhook._index import Index


def known_texts(n: int) -> list[bytes]:
    """`n` texts sharing a prefix, some with long runs of one letter (anchors must tell them apart)."""
    return [
        f"known text {i:03}: {'abcdefghij'[i % 10] * (i % 40)} end {i}".encode() for i in range(n)
    ]


def replay(
    index: Index,
    data: Sequence[bytes],
    ops: Sequence[tuple[Any, ...]],
    filler: Callable[[Any], bytes],
) -> None:
    """Apply ("add", i), ("add", i, summary), ("discard", i) and ("find", picked, arg) to
    `index`. Each find searches the picked texts joined by `filler(arg)`: every place an indexed
    text occurs must be among the candidates, and no text that is not indexed; and a search for
    summaries (`summaries=True`) must give every place of a text indexed as a summary since it
    was last discarded (added as one, or as a source first and as a summary after)."""
    indexed: set[int] = set()
    summaries: set[int] = set()
    for op in ops:
        if op[0] == "add":
            summary = len(op) > 2 and bool(op[2])
            index.add(data[op[1]], f"d{op[1]}", summary)
            indexed.add(op[1])
            if summary:
                summaries.add(op[1])
        elif op[0] == "discard":
            index.discard(f"d{op[1]}")
            indexed.discard(op[1])
            summaries.discard(op[1])
        else:
            _, picked, arg = op
            pad = filler(arg)
            value = pad + pad.join(data[i] for i in picked) + pad
            named = {f"d{i}" for i in indexed}
            got = set(index.find(value))
            assert placed(value, data, indexed) <= got
            assert not {d for _, _, d in got} - named
            got = set(index.find(value, summaries=True))
            assert placed(value, data, summaries) <= got
            assert not {d for _, _, d in got} - named


def occurrences(haystack: bytes, needle: bytes) -> list[int]:
    """Every place `needle` starts in `haystack`, overlapping ones too."""
    out, at = [], haystack.find(needle)
    while at != -1:
        out.append(at)
        at = haystack.find(needle, at + 1)
    return out


def placed(value: bytes, data: Sequence[bytes], indexed: set[int]) -> set[tuple[int, int, str]]:
    """(start, end, "d<i>") of every place an indexed text `data[i]` lies in `value`: what an
    index's confirmed candidates must be."""
    return {(at, at + len(data[i]), f"d{i}") for i in indexed for at in occurrences(value, data[i])}
