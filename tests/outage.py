"""Store faults for tests: an outage (every call of the store protocol, or of some of its
methods, failing while it lasts) and one call failing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NoReturn

from policyhook import Store

#: Every operation of the Store protocol (tests/store_contract.py checks what each one does).
OPERATIONS = sorted(
    name for name in dir(Store) if not name.startswith("_") and callable(getattr(Store, name))
)
#: What a store answers with: the protocol's operations and the optional methods a store may
#: offer. Every one of them fails while `store_down` holds it down.
STORE_METHODS = (*OPERATIONS, "put_source_hashed")


@contextlib.contextmanager
def store_down(store: Store, methods: Collection[str] = STORE_METHODS) -> Iterator[None]:
    """`store` unreachable: every method of the protocol (or those of `methods`: a partial
    outage, one table locked, one replica gone) raises ConnectionError until the block ends."""

    def down(*args: object, **kwargs: object) -> NoReturn:
        raise ConnectionError("store down")

    for name in methods:
        setattr(store, name, down)
    try:
        yield
    finally:
        for name in methods:
            vars(store).pop(name, None)


@contextlib.contextmanager
def one_fault(stores: Sequence[Store], at: int) -> Iterator[list[str]]:
    """The `at`-th call of the store protocol, counted over every handle of `stores` (a call a
    store makes of its own methods too), raises ConnectionError, once: a dropped connection,
    a timeout; `at` 0, none (the calls counted only). Yields the names of the calls made, in
    order."""
    calls: list[str] = []

    def faulty(method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            if len(calls) == at:
                raise ConnectionError(f"store fault at call {at} ({name})")
            return method(*args, **kwargs)

        return call

    with _wrapped(stores, faulty):
        yield calls


@contextlib.contextmanager
def raised(stores: Sequence[Store]) -> Iterator[list[str]]:
    """What the calls of the store protocol raise inside the block, over every handle of
    `stores` (`name: error`, in order): a server's own timeout or dropped connection, on which
    a guard refuses (fail closed), told apart from what the guard decided."""
    errors: list[str] = []

    def watched(method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                errors.append(f"{name}: {exc!r}")
                raise

        return call

    with _wrapped(stores, watched):
        yield errors


@contextlib.contextmanager
def _wrapped(
    stores: Sequence[Store], wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]
) -> Iterator[None]:
    """Every method of the store protocol of every handle of `stores` replaced by
    `wrap(method, name)` inside the block."""
    patched = [(store, name) for store in stores for name in STORE_METHODS if hasattr(store, name)]
    for store, name in patched:
        setattr(store, name, wrap(getattr(store, name), name))
    try:
        yield
    finally:
        for store, name in patched:
            vars(store).pop(name, None)
