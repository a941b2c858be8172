"""The one "did you mean" hint every error message about a misspelt name uses."""

from __future__ import annotations

import difflib
from collections.abc import Collection


def closest(name: str, candidates: Collection[str]) -> str | None:
    """The candidate an author most likely meant by `name`, or None."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(name: str, candidates: Collection[str], *, listing: str = "") -> str:
    """` (did you mean 'x'?)`; else ` (<listing>: a, b)` when `listing` names the candidates."""
    hint = closest(name, candidates)
    if hint is not None:
        return f" (did you mean {hint!r}?)"
    if listing:
        return f" ({listing}: {', '.join(sorted(candidates)) or 'none'})"
    return ""
