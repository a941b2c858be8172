"""The source sets of summaries the ledger resolved or recorded lately, kept so that a summary
found again is not walked again (`Ledger._rests_on`), with the rule for when one may have grown.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from collections.abc import Set as AbstractSet

#: Summaries whose full source sets are kept in memory (most recently used), and the source ids
#: those sets may hold in all: a long string holding a thousand cached summaries (4 MB of a
#: window rendered as one string) is not walked again summary by summary every call, and memory
#: stays bounded (~4 MB of ids) however many sources each rests on.
CLOSURES = 4096
CLOSURE_IDS = 65_536


class Closures:
    """The source sets of recently recorded or resolved summaries (at most `CLOSURES`, and the
    parents of the newest), so a summary resolved again is not walked. Exact only while no
    summary they rest on grows: the ledger clears them when one may have (`Ledger._remember`).

    Kept out of the cyclic GC's sight: a frozenset is visited item by item at every collection
    of its generation, so 256 closures of a k-pass rolling chain made each collection cost
    256 k visits (the chain's p99 was its collections: 1-3 ms young, 4-16 ms middle, k = 3,000).
    The newest closure stays the frozenset regions share, so a rolling chain's next pass takes
    it as it is; an older one is kept as a dict of its ids (`dict.fromkeys`: a dict holding
    only str keys and None values is never tracked) and made a frozenset again when asked for.
    A summary just recorded moves its parents' closures out of the older ones: the one that was
    the newest (a rolling chain's previous pass, the input a loop summarizes again) is kept as
    it is, beside the newest, until the next record that is not made from it; the others are
    dropped. So a rolling chain keeps two closures, a loop summarizing the same input again
    walks nothing, and nothing is copied on either hot path.
    """

    __slots__ = (
        "_as_of", "_head", "_head_id", "_ids", "_older", "_parents", "_unanchored", "drops"
    )  # fmt: skip

    def __init__(self) -> None:
        # Where the store found every id of a closure held (`View.as_of`), by summary id: kept
        # only with the closure it was found for (the newest's and its parents' frozensets).
        self._as_of: dict[str, object] = {}
        self._head_id: str | None = None
        self._head: AbstractSet[str] = frozenset()
        # The newest's parents whose closures were kept as given (see the class docstring).
        self._parents: dict[str, AbstractSet[str]] = {}
        self._older: OrderedDict[str, dict[str, None]] = OrderedDict()  # LRU, untracked values
        self._ids = 0  # source ids the older closures hold in all (`CLOSURE_IDS`)
        # Ids whose closure rests on summaries not all cached (`put` with `anchored` False).
        self._unanchored: set[str] = set()
        self.drops = 0  # times closures were dropped as possibly outgrown (`Ledger._take`)

    def __len__(self) -> int:
        return len(self._older) + len(self._parents) + (self._head_id is not None)

    def get(self, summary_id: str) -> AbstractSet[str] | None:
        if summary_id == self._head_id:
            return self._head
        kept = self._parents.get(summary_id)
        if kept is not None:
            return kept
        older = self._older.get(summary_id)
        if older is None:
            return None
        self._older.move_to_end(summary_id)
        return frozenset(older)

    def as_of(self, summary_id: str, sources: AbstractSet[str]) -> object | None:
        """Where the store found every id of `sources` held, if `sources` is the closure
        kept for `summary_id` (the very set, so never one made otherwise) and that is known."""
        as_of = self._as_of.get(summary_id)
        if as_of is None:
            return None
        kept = self._head if summary_id == self._head_id else self._parents.get(summary_id)
        return as_of if kept is sources else None

    def put(
        self,
        summary_id: str,
        sources: AbstractSet[str],
        parents: Collection[str] = (),
        anchored: bool = False,
        as_of: object | None = None,
    ) -> None:
        """`sources` becomes the newest closure. `parents`: the summaries `summary_id` was just
        made from, when it was just recorded: their closures leave the older ones, the newest
        one's and those kept from the last record stay as they are (`_parents`), the others
        go. The newest displaced, if not one of them, joins the older ones. `anchored`: every
        summary it rests on was cached when it was made (walked in memory, or recorded on
        anchored parents), so any growth of one is seen (`Ledger._remember`); a closure the
        store gave is not, and goes when a summary new to the cache arrives
        (`drop_unanchored`). `as_of`: where the store found every id of `sources` held
        (`View.as_of`), kept while `sources` is the newest or a kept parent's."""
        head_id, kept = self._head_id, self._parents
        if parents:  # a record: what it was made from replaces the last record's parents
            made_from: dict[str, AbstractSet[str]] = {}
            for parent, closure in kept.items():
                if parent in parents:
                    made_from[parent] = closure
                else:
                    self._unanchored.discard(parent)
                    self._as_of.pop(parent, None)
            for parent in parents:
                if self._drop_older(parent):
                    self._unanchored.discard(parent)
            kept = self._parents = made_from
        if head_id is not None and head_id != summary_id:
            if head_id in parents:
                kept[head_id] = self._head
            else:
                self._drop_older(head_id)
                self._older[head_id] = dict.fromkeys(self._head)
                self._ids += len(self._head)
                self._as_of.pop(head_id, None)
        if kept:
            kept.pop(summary_id, None)
        self._drop_older(summary_id)
        self._head_id, self._head = summary_id, sources
        if as_of is None:
            self._as_of.pop(summary_id, None)
        else:
            self._as_of[summary_id] = as_of
        if anchored:
            self._unanchored.discard(summary_id)
        else:
            self._unanchored.add(summary_id)
        while len(self._older) >= CLOSURES or self._ids > CLOSURE_IDS:
            oldest, ids = self._older.popitem(last=False)
            self._ids -= len(ids)
            self._unanchored.discard(oldest)

    def _drop_older(self, summary_id: str) -> bool:
        """Drop an older closure, if held; whether one was."""
        ids = self._older.pop(summary_id, None)
        if ids is None:
            return False
        self._ids -= len(ids)
        return True

    def anchored(self, summary_ids: Iterable[str]) -> bool:
        """Whether each of `summary_ids` has a closure here that is anchored."""
        for i in summary_ids:  # (a loop: a generator's frame per call cost more than the test)
            if i in self._unanchored:
                return False
            if not (i == self._head_id or i in self._parents or i in self._older):
                return False
        return True

    def drop_unanchored(self) -> None:
        if self._unanchored:
            self.drops += 1
        for summary_id in self._unanchored:
            if summary_id == self._head_id:
                self._head_id, self._head = None, frozenset()
            self._parents.pop(summary_id, None)
            self._drop_older(summary_id)
            self._as_of.pop(summary_id, None)
        self._unanchored.clear()

    def pop(self, summary_id: str) -> None:
        if summary_id == self._head_id:
            self._head_id, self._head = None, frozenset()
        self._parents.pop(summary_id, None)
        self._drop_older(summary_id)
        self._unanchored.discard(summary_id)
        self._as_of.pop(summary_id, None)

    def clear(self) -> None:
        if self._head_id is not None or self._parents or self._older:
            self.drops += 1
        self._head_id, self._head = None, frozenset()
        self._parents = {}
        self._older.clear()
        self._ids = 0
        self._unanchored.clear()
        self._as_of.clear()
