"""A store fault at every single store call of an agent's session: never a wrong allow, never a
lost output.

The session registers a config, summarizes it, registers the summary's text again (an adapter
archiving every message) and a turn quoting it, summarizes the summary with the config, and has
a new process decide. The store fails once, at its k-th call, for every k the session makes
(an OSError, or the store's own unavailable error), on MemoryStore and SQLite. Then the config
is evicted, and every text resting on it must be refused: by the guard that saw the fault always,
and by a new guard whenever the store knows the text (a summary the store never recorded is
unknown to other processes: docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from policyhook import (
    Guard,
    MemoryStore,
    SQLiteStore,
    Store,
    StoreUnavailableError,
    UnsafeRecompactionError,
)
from policyhook._provenance import digest, encode

CONFIG = "config read: retry_ceiling = 7 for the billing job, backoff 250ms"
SUMMARY = "Summary: the billing job retries with retry_ceiling = 7 and backoff 250ms"
DEEPER = "Summary of summaries: billing retries, retry_ceiling = 7, backoff 250ms"
QUOTING = f"Assistant: as summarized before, {SUMMARY}"


class OneFault:
    """Wraps a store: its `at`-th call (counting every Store operation) raises `error`."""

    def __init__(self, inner: Store, at: int, error: Exception) -> None:
        self.inner, self.at, self.error, self.calls = inner, at, error, 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.at:
                raise self.error
            return attribute(*args, **kwargs)

        return call


def session(store: OneFault, at: int = 0) -> tuple[Guard, set[str]]:
    """The agent's session on `store`, going on after each failure as an adapter would (the
    guard is made before calls are counted: a store that fails there makes no guard). Returns
    the guard and the outputs it granted."""
    guard = Guard(store=cast(Store, store))
    store.calls, store.at = 0, at
    outputs = {CONFIG: SUMMARY, f"{SUMMARY}\n{CONFIG}": DEEPER}

    def summarize(value: Any) -> str:
        return outputs["\n".join(value) if isinstance(value, list) else value]

    guarded = guard(summarize, summarizer="s")
    granted: set[str] = set()
    steps: list[Callable[[], Any]] = [
        lambda: guard.record_source(CONFIG, "config_read", "cfg"),
        lambda: guarded(CONFIG),
        lambda: guard.record_source(SUMMARY, "ai_turn", "msg-1"),
        lambda: guard.record_source(QUOTING, "ai_turn", "msg-2"),
        lambda: guarded([SUMMARY, CONFIG]),
    ]
    for step in steps:
        for _ in range(2):  # a step that failed is tried again, as a caller would
            try:
                result = step()
            except UnsafeRecompactionError:
                continue  # refused while the store could not answer: fail closed
            except (OSError, StoreUnavailableError):
                continue  # a write the caller saw fail
            if isinstance(result, str):
                assert result in outputs.values()  # a granted call's output is the caller's
                granted.add(result)
            break
    return guard, granted


def count_calls(make: Callable[[], Store]) -> int:
    store = OneFault(make(), 0, OSError())
    _, granted = session(store)
    assert granted == {SUMMARY, DEEPER}
    return store.calls


def refused_everywhere(
    guard: Guard, granted: set[str], inner: Store, reopen: Callable[[], Store]
) -> None:
    """With the config evicted, every granted output and the turn quoting the first one are
    refused: by `guard` always, by a new guard wherever the store knows the text."""
    inner.evict("cfg")
    resting = sorted(granted | ({QUOTING} if SUMMARY in granted else set()))
    for value in [*resting, *(f"  {text}\n" for text in resting), *([resting] if resting else [])]:
        assert guard.check(value, summarizer="p").effect == "deny", value
        with pytest.raises(UnsafeRecompactionError):
            guard(lambda v: "never", summarizer="s")(value)
    later = Guard(store=reopen())
    key = inner.secret()
    for text in resting:
        if inner.lookup([digest(key, encode(text))]):  # the store knows it: so must every guard
            assert later.check(text, summarizer="p").effect == "deny", text


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("error", ["oserror", "unavailable"])
def test_one_fault_at_any_store_call(tmp_path: Path, kind: str, error: str) -> None:
    """For every k: the k-th store call fails once; every text resting on the evicted config is
    refused by the guard that saw the fault, and by a new one wherever the store knows it."""
    fault = OSError(5, "Input/output error") if error == "oserror" else StoreUnavailableError("x")
    paths = iter(tmp_path / f"store-{i}.sqlite" for i in range(10_000))

    def maker() -> tuple[Callable[[], Store], Callable[[], Store]]:
        if kind == "memory":
            memory = MemoryStore()
            return (lambda: memory), (lambda: memory)
        path = next(paths)
        return (lambda: SQLiteStore(path)), (lambda: SQLiteStore(path))

    make, _ = maker()
    calls = count_calls(make)
    assert calls > 10  # the sweep is not vacuous
    for at in range(1, calls + 1):
        make, reopen = maker()
        inner = make()
        guard, granted = session(OneFault(inner, 0, fault), at)
        assert SUMMARY in granted, at  # one failed call, tried again, is not a refusal for good
        refused_everywhere(guard, granted, inner, reopen)
