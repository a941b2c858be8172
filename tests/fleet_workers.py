"""Worker processes for the fleet tests: each runs its own Guard on one shared store.

A worker is a separate Python process (spawned, not forked: a store's pool must be made in the
process that uses it) that takes commands from its inbox and answers on its outbox, so a test
can say "worker 3 evicts cfg; now worker 0 decides" and read each decision back.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Spec = tuple[str, str, str]  # (kind, url or path, schema / namespace)


def open_store(spec: Spec, **options: Any) -> Any:
    """A handle on the shared store named by `spec`, opened in this process."""
    from policyhook import PostgresStore, RedisStore, SQLiteStore

    kind, where, name = spec
    if kind == "postgres":
        return PostgresStore(where, schema=name, **options)
    if kind == "redis":
        return RedisStore(where, namespace=name, **options)
    return SQLiteStore(where, **options)


def _serve(number: int, inbox: Any, outbox: Any) -> None:
    """The worker's loop: one command in, one answer out, until `None`."""
    from policyhook import Guard, UnsafeRecompactionError, request

    guard: Any = None
    store: Any = None

    said: list[str] = []  # what the summarizer returns next, when the test chose it

    def compact(messages: list[str]) -> str:
        if said:
            return said.pop()
        return f"Summary by worker w{number}: " + " | ".join(m[:40] for m in messages)

    while (command := inbox.get()) is not None:
        name, *args = command
        try:
            if name == "open":
                if store is not None:
                    store.close()
                options = {"timeout": args[1]} if args[0][0] != "sqlite" else {}
                store = open_store(args[0], **options)
                guard = Guard(args[2] if len(args) > 2 else None, store=store)
                summarize = guard(compact, summarizer="compact")
                answer: Any = "ok"
            elif name == "record":
                answer = guard.record_source(args[0], kind=args[1], source_id=args[2]).id
            elif name == "evict":
                answer = store.evict(args[0])
            elif name == "summarize":  # (messages, window[, the summarizer's output])
                said[:] = args[2:]
                with request(window=args[1]):
                    try:
                        answer = ("granted", summarize(args[0]))
                    except UnsafeRecompactionError as refusal:
                        answer = ("refused", refusal.dead_sources)
                        if len(args) > 2:  # a chosen output: say why it was refused
                            answer = ("refused", refusal.decision.message)
                said.clear()
            elif name == "facts":  # the per-fact provenance the store holds for a summary
                (summary_id,) = guard.ledger.resolve(args[0], "any").summaries
                answer = sorted(store.facts([summary_id]).get(summary_id, []))
            elif name == "check":
                with request(window=args[1]):
                    d = guard.check(args[0], summarizer="compact")
                answer = (d.effect, d.depth, d.dead_sources)
            else:
                answer = RuntimeError(f"unknown command {name!r}")
        except Exception as exc:
            answer = RuntimeError(f"worker {number}: {name} raised:\n{traceback.format_exc()}")
            del exc
        outbox.put(answer)
    if store is not None:
        store.close()


@dataclass
class Worker:
    number: int
    process: Any
    inbox: Any
    outbox: Any

    def send(self, *command: Any) -> None:
        self.inbox.put(command)

    def drain(self) -> None:
        """Drop answers a failed test left unread."""
        while True:
            try:
                self.outbox.get(timeout=0.05)
            except queue.Empty:
                return

    def answer(self, timeout: float = 60) -> Any:
        try:
            got = self.outbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"worker {self.number} gave no answer in {timeout}s") from None
        if isinstance(got, RuntimeError):
            raise got
        return got

    def __call__(self, *command: Any, timeout: float = 60) -> Any:
        """Send one command and wait for its answer."""
        self.send(*command)
        return self.answer(timeout)


@contextmanager
def fleet(size: int) -> Iterator[list[Worker]]:
    """`size` worker processes, stopped (then terminated if need be) on exit."""
    context = multiprocessing.get_context("spawn")
    workers = []
    for number in range(size):
        inbox, outbox = context.Queue(), context.Queue()
        process = context.Process(
            target=_serve, args=(number, inbox, outbox), name=f"policyhook-worker-{number}"
        )
        process.start()
        workers.append(Worker(number, process, inbox, outbox))
    try:
        yield workers
    finally:
        for w in workers:
            w.inbox.put(None)
        for w in workers:
            w.process.join(15)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(5)
