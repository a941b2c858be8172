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

_resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def register(owner: Any, reset: Callable[[Any], None]) -> None:
    """Call `reset(owner)` in every child forked while `owner` is alive."""
    with _lock:
        _resets[owner] = reset


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # the parent may have held it
    for owner, reset in list(_resets.items()):
        try:
            reset(owner)
        except Exception:  # one failing object must not leave the others locked
            _logger.warning("policyhook: could not renew %r after fork", owner, exc_info=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
