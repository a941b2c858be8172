"""policyhook's on/off switches in the environment, read one way (POLICYHOOK_FORCE_AUDIT, ...)."""

from __future__ import annotations

import os

#: The values that turn a switch on (any case, surrounding blanks ignored); all else is off.
TRUE = frozenset({"1", "true", "yes", "on"})


def flag(name: str) -> bool:
    """Whether the environment variable `name` is set to a true value."""
    return os.environ.get(name, "").strip().lower() in TRUE
