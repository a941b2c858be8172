"""After `os.fork()`: fresh locks, connections and threads in the child, for every live object.

A child inherits every lock in the state it had at the fork, including one another thread held,
which nobody in the child will ever release; and no thread but the forking one survives. Prefork
servers (gunicorn, uWSGI, multiprocessing) fork after the guard is made, so each object that holds
a lock, a connection or a thread registers how to renew them here.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger(__name__)

#: id(owner) -> (weak reference to it, how to renew it). Keyed by id, not by the object, so that
#: owners need not be hashable (a store subclass may define __eq__ without __hash__).
_resets: dict[int, tuple[weakref.ref[Any], Callable[[Any], None]]] = {}
_lock = threading.Lock()


def register(owner: Any, reset: Callable[[Any], None]) -> None:
    """Call `reset(owner)` in every child forked while `owner` is alive."""
    key = id(owner)

    def forget(_: weakref.ref[Any]) -> None:
        _resets.pop(key, None)

    with _lock:
        _resets[key] = (weakref.ref(owner, forget), reset)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # the parent may have held it
    for ref, reset in list(_resets.values()):
        owner = ref()
        if owner is None:
            continue
        try:
            reset(owner)
        except Exception:  # one failing object must not leave the others locked
            _logger.warning("policyhook: could not renew %r after fork", owner, exc_info=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
