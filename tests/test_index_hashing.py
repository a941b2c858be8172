"""The input hashed once: each message's keyed digest serves the exact lookup of the message and
of the message stripped (outputs are recorded stripped), the index's confirmations, the region
id and the ids of unrecognised gaps, so the bytes of a long message pass through BLAKE2b once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policyhook._provenance import digest, prefix_digests

KEY = b"k" * 32


class TestDigests:
    @given(data=st.binary(max_size=300), cut=st.integers(0, 300))
    def test_the_prefix_and_the_whole_as_hashed_apart(self, data: bytes, cut: int) -> None:
        """Both digests are those of `digest` on the prefix and on the whole."""
        cut = min(cut, len(data))
        assert prefix_digests(KEY, data, cut) == (digest(KEY, data[:cut]), digest(KEY, data))
