"""The spool: where remedies archive while the store refuses writes.

With the store down every re-summarization is refused (nothing can be decided), and an offload
that cannot archive leaves the region in the window, which then grows until the store is back.
A spool is a second store the guard's own process can write (a local `SQLiteStore`): the
archive and its pointer go there instead, the pointer takes the region's place (the window back
in budget), `Guard.retrieve` reads the archive from it, and once the store answers again what
the spool holds is moved to the store, for every process to see.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from policyhook._provenance import Source, SourceIdConflictError, Store

_logger = logging.getLogger("policyhook")

#: Seconds between two attempts to move the spool to a store that refused the last one (the
#: guard moves it only after a read the store answered: a store that reads but refuses writes
#: costs one failing write per interval, not one per call).
RETRY_AFTER = 5.0
#: Entries moved per attempt: a bounded catch-up inside the call that finds the store back.
BATCH = 16


class Spool:
    """A store held in reserve for archives, and the move of what it holds to the main store."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._retry_at = 0.0
        #: What it may hold: True until a move found it empty (an earlier process may have
        #: left archives in it), and again after every put. Read on every decision: no I/O.
        self.holding = True

    def put(self, source: Source, text: str) -> None:
        self.store.put_source(source, text)
        self.holding = True

    def get(self, source_id: str) -> str | None:
        return self.store.get_source(source_id)

    def move(self, write: Callable[[Source, str], None]) -> int:
        """Write what the spool holds through `write` (to the main store), at most `BATCH`
        entries a call; each written is evicted from the spool; how many were. The first
        failure stops the move until `RETRY_AFTER` seconds have passed. Never raises: the
        caller's call goes on, and what is not moved stays in the spool (still read by
        `Guard.retrieve`)."""
        moved = 0
        if self._clock() < self._retry_at or not self._lock.acquire(blocking=False):
            return moved  # waiting for the store, or another thread is moving it
        try:
            self.holding = False  # (a put meanwhile sets it again: moved next time)
            held = self.store.sources(BATCH)
            for source, text in held:
                try:
                    write(source, text)
                except SourceIdConflictError:  # never for ids made from their text; kept
                    _logger.warning(
                        "policyhook: spooled %s names another text in the store; it stays in "
                        "the spool",
                        source.id,
                        exc_info=True,
                    )
                    continue
                self.store.evict(source.id)
                moved += 1
            if moved:
                _logger.info("policyhook: %d spooled entries moved to the store", moved)
            if len(held) == BATCH:
                self.holding = True
        except Exception:
            self.holding = True
            _logger.debug("policyhook: moving the spool to the store failed", exc_info=True)
            self._retry_at = self._clock() + RETRY_AFTER
        finally:
            self._lock.release()
        return moved
