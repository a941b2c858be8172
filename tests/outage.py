"""A store outage for tests: every call of the store protocol fails while it lasts."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import NoReturn

from policyhook import Store

#: What a `Store` answers with (`policyhook._provenance.Store`, and the optional methods a
#: store may offer): every one of them fails while `store_down` holds it down.
STORE_METHODS = (
    *(name for name, v in vars(Store).items() if callable(v) and not name.startswith("_")),
    "put_source_hashed",
)


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
