"""The input hashed once: each message's keyed digest serves the exact lookup of the message and
of the message stripped (outputs are recorded stripped), the index's confirmations, the region
id and the ids of unrecognised gaps, so the bytes of a long message pass through BLAKE2b once."""

from __future__ import annotations

import hashlib
from typing import Any
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from policyhook import MemoryStore, Region
from policyhook._provenance import Ledger, digest, encode, prefix_digests

KEY = b"k" * 32
_BLAKE2B = hashlib.blake2b  # the real one, for the counting stand-in


class _Counting:
    """hashlib.blake2b, counting the bytes it is given (constructor and updates)."""

    def __init__(self) -> None:
        self.hashed = 0

    def __call__(self, data: Any = b"", **kwargs: Any) -> Any:
        counter = self

        class Hash:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def update(self, more: Any) -> None:
                counter.hashed += len(more)
                self.inner.update(more)

            def copy(self) -> Hash:
                return Hash(self.inner.copy())

            def hexdigest(self) -> str:
                return str(self.inner.hexdigest())

        self.hashed += len(data)
        return Hash(_BLAKE2B(data, **kwargs))


class TestDigests:
    @given(data=st.binary(max_size=300), cut=st.integers(0, 300))
    def test_the_prefix_and_the_whole_as_hashed_apart(self, data: bytes, cut: int) -> None:
        """Both digests are those of `digest` on the prefix and on the whole."""
        cut = min(cut, len(data))
        assert prefix_digests(KEY, data, cut) == (digest(KEY, data[:cut]), digest(KEY, data))


class TestHashedOnce:
    def _ledger(self) -> tuple[Ledger, str]:
        ledger = Ledger(MemoryStore())
        summary = ("the deploy window closed at nine and the retry ceiling is seven " * 4).strip()
        ledger.record_summary(summary, Region("r:p", sources=frozenset({"src"})), "w")
        return ledger, summary

    def _hashed(self, ledger: Ledger, value: str) -> tuple[int, Any]:
        counting = _Counting()
        with mock.patch.object(hashlib, "blake2b", counting):
            found = ledger.resolve(value, "w")
        return counting.hashed, found

    def test_a_message_ending_in_whitespace_is_hashed_once(self) -> None:
        """A long message ending with a newline (most do) has its bytes hashed once, not once
        whole and once stripped; its stripped form is still looked up (a known output comes
        back as the summarizer wrote it) and the rest of it is still searched."""
        ledger, summary = self._ledger()
        body = "new turn words about the jobs, all of them original. " * 300
        value = body + summary + "\n\n"
        hashed, found = self._hashed(ledger, value)
        assert len(encode(value)) <= hashed < 2 * len(encode(body))
        assert found.region.depth == 1 and "src" in found.region.sources
        hashed, found = self._hashed(ledger, summary + "\n")  # found whole, by its stripped form
        assert found.region.depth == 1 and found.unregistered == ()

    def test_leading_whitespace_is_still_looked_up_stripped(self) -> None:
        """Whitespace on both sides: the stripped form is hashed on its own (no shared prefix)
        and a known output is recognised whole, as before."""
        ledger, summary = self._ledger()
        _, found = self._hashed(ledger, "  \n" + summary + " \n")
        assert found.region.depth == 1 and found.unregistered == ()


class TestRecordedIdsFromTheDigest:
    @given(text=st.text(min_size=1, max_size=80), kind=st.sampled_from(["turn", "tool_output"]))
    def test_a_derived_source_id_is_the_ledgers_text_id(self, text: str, kind: str) -> None:
        """`record_source` without an id derives it from the digest it hashed the turn for:
        the id `Ledger.text_id(kind, text)` gives (other processes derive it so), whitespace,
        non-ASCII and lone surrogates included."""
        ledger = Ledger(MemoryStore())
        assert ledger.record_source(text, kind).id == ledger.text_id(kind, text)

    def test_a_new_turn_is_hashed_once_by_the_ledger(self) -> None:
        """Recording a new 16 KB turn hashes its bytes twice in all: once for the ledger's
        digest (its lookup, its id and its search's confirmations share it) and once by
        MemoryStore under its own secret; not a third time for its id."""
        ledger = Ledger(MemoryStore())
        turn = "a new turn of the session, with words and more words. " * 300
        counting = _Counting()
        with mock.patch.object(hashlib, "blake2b", counting):
            ledger.record_source(turn, "turn")
        assert counting.hashed < 3 * len(encode(turn))
