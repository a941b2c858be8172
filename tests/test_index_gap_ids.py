"""The id of unrecognised content between known texts is derived from the message's digest and
the gap's place (`Ledger._gap`), as it always was: archived originals and summaries resting on
them are stored under these ids, so a change of derivation would orphan them."""

from __future__ import annotations

from policyhook._provenance import UNREGISTERED, Ledger, Region, digest, encode
from policyhook.stores import MemoryStore


class TestGapIds:
    def test_each_gap_id_is_the_digest_of_the_message_digest_and_its_place(self) -> None:
        """A message holding a known summary twice, with words around (one non-ASCII): each
        gap's id is `window:` and the keyed digest of `{message digest}:{start}:{length}`."""
        ledger = Ledger(MemoryStore())
        summary = "summary: the deploy window closed and the jitter was 40 ms"
        ledger.record_summary(summary, Region("r", sources=frozenset({"cfg"})), "w")
        message = f"head words, café. {summary} middle words {summary} and the tail"
        data, key = encode(message), ledger.store.secret()
        whole = digest(key, data)
        first = data.find(encode(summary))
        second = data.find(encode(summary), first + 1)
        places = [(0, first), (first + len(summary), second), (second + len(summary), len(data))]
        want = {
            f"{UNREGISTERED}:{digest(key, f'{whole}:{s}:{e - s}'.encode())[:16]}" for s, e in places
        }
        region = ledger.resolve(message, "w").region
        assert region.sources == want | {"cfg"}
