"""Hot reload: follow a policy path while running, swapping the compiled set between decisions.

A reload compiles the new files completely before one reference assignment publishes them, so a
decision sees exactly one revision. A set that fails to load is logged and counted, and the last
good set stays in force.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from policyhook import _fork
from policyhook._cel import Backend
from policyhook._errors import PolicyError, PolicyIssue
from policyhook._loader import compile_sources, read_sources, revision_of
from policyhook._policy import PolicySet

_logger = logging.getLogger("policyhook.reload")

#: Called after every reload attempt with ("success" | "failure", revision in force afterwards).
ReloadListener = Callable[[str, str], None]


class PolicyWatcher:
    """Holds the current PolicySet of `path` and polls its files every `interval` seconds."""

    def __init__(
        self,
        path: str | Path,
        *,
        interval: float = 2.0,
        backend: Backend | None = None,
        on_reload: ReloadListener | None = None,
    ) -> None:
        self.path = Path(path)
        self.interval = interval
        self.backend = backend
        self.on_reload = on_reload
        self.current: PolicySet = compile_sources(read_sources(self.path), backend=backend)
        self.last_error: PolicyError | None = None
        self._failed_revision: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        _fork.register(self, PolicyWatcher._after_fork)

    def check(self) -> bool:
        """Reload if the files changed; True when a new set was put in force."""
        with self._lock:
            try:
                sources = read_sources(self.path)
            except PolicyError as exc:
                return self._failed(exc, revision=f"unreadable:{exc}")
            revision = revision_of(sources)
            if revision in (self.current.revision, self._failed_revision):
                return False
            try:
                candidate = compile_sources(sources, backend=self.backend)
            except PolicyError as exc:
                return self._failed(exc, revision)
            except Exception as exc:  # a loader bug is still a failed reload, counted and logged
                issue = PolicyIssue(str(self.path), f"{type(exc).__name__}: {exc}", code="internal")
                return self._failed(PolicyError([issue]), revision)
            self.current = candidate  # one reference assignment: atomic for readers
            self.last_error = None
            self._failed_revision = None
        _logger.info("policyhook: policies reloaded from %s, revision %s", self.path, revision)
        self._notify("success")
        return True

    def _failed(self, error: PolicyError, revision: str) -> bool:
        if revision == self._failed_revision:
            return False
        self._failed_revision = revision
        self.last_error = error
        _logger.error(
            "policyhook: policy reload from %s failed; keeping revision %s\n%s",
            self.path,
            self.current.revision,
            error,
        )
        self._notify("failure")
        return False

    def _notify(self, outcome: str) -> None:
        if self.on_reload is not None:
            try:
                self.on_reload(outcome, self.current.revision)
            except Exception:
                _logger.warning("policyhook: reload listener failed", exc_info=True)

    def start(self) -> PolicyWatcher:
        """Poll in a daemon thread until `stop()`."""
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(target=self._run, name="policyhook-reload", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # never let the poller die silently
                _logger.exception("policyhook: policy reload check failed")

    def _after_fork(self) -> None:
        """No thread survives a fork: a child polls in its own (prefork servers follow edits)."""
        self._lock = threading.Lock()  # the parent's poller may have held it
        running = self._thread is not None and not self._stop.is_set()
        self._stop = threading.Event()
        self._thread = None
        if running:
            self.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
