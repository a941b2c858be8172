"""SQLiteStore refuses to go on with a file deleted or replaced under it (fail closed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policyhook import Source, SQLiteStore
from policyhook._errors import StoreUnavailableError


class TestReplacedFile:
    def test_a_file_replaced_while_open_is_refused_by_every_read(self, tmp_path: Path) -> None:
        """Another store file moved over the open one (a restore, a redeploy): the next
        liveness lookup, view and write raise instead of answering from the unlinked file."""
        path = tmp_path / "store.db"
        store = SQLiteStore(path)
        store.put_source(Source("cfg", "config_read"), "retry ceiling 7")
        assert store.live(["cfg"]) == {"cfg"}
        other = SQLiteStore(tmp_path / "restored.db")
        other.put_source(Source("cfg", "config_read"), "retry ceiling 7")
        other.evict("cfg")
        other.close()
        os.replace(tmp_path / "restored.db", path)
        for read in (
            lambda: store.live(["cfg"]),
            lambda: store.view(0, 10, [], frozenset({"cfg"})),
            lambda: store.put_source(Source("new", "tool_output"), "more"),
        ):
            with pytest.raises(StoreUnavailableError, match="deleted or replaced"):
                read()
        store.close()

    def test_the_same_file_is_not_refused(self, tmp_path: Path) -> None:
        """Reads and writes through another handle leave the file what it was."""
        path = tmp_path / "store.db"
        store, again = SQLiteStore(path), SQLiteStore(path)
        again.put_source(Source("cfg", "config_read"), "retry ceiling 7")
        assert store.live(["cfg"]) == {"cfg"}
        again.evict("cfg")
        assert store.live(["cfg"]) == frozenset()
        store.close()
        again.close()
