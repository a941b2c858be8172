"""Property tests' settings, made deeper on demand: `POLICYHOOK_DEEP=N` runs the property
tests (provenance, the index, stores, adapters, remedies) with N times their examples (stateful
machines: twice their steps), randomized, with no example database, printing a
`@reproduce_failure` blob for what they find.

Why: the suite's runs are derandomized (the same examples every run, so CI is stable) and
short; the cache-dependent wrong allows of the last rounds were found only by longer random
runs. This is how anyone reruns those:

    POLICYHOOK_DEEP=20 .venv/bin/python -m pytest -q tests/test_property_allow.py
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

#: The environment variable naming how many times deeper: a whole number >= 1.
VARIABLE = "POLICYHOOK_DEEP"


def factor(environ: Mapping[str, str] = os.environ) -> int:
    """How many times deeper (`POLICYHOOK_DEEP`): 0 when unset or empty (the suite's own runs)."""
    raw = environ.get(VARIABLE, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{VARIABLE}={raw!r}: a whole number >= 1 (how many times deeper)")
    return value


def scaled(base: settings, times: int | None = None) -> settings:
    """`base` as the suite runs it, or `times` (default: `factor()`) times deeper: randomized,
    no example database (a run leaves nothing behind to replay), the blob printed."""
    times = factor() if times is None else times
    if not times:
        return base
    return settings(
        base,
        max_examples=base.max_examples * times,
        stateful_step_count=base.stateful_step_count * min(times, 2),
        derandomize=False,
        database=None,
        print_blob=True,
    )


def suite(examples: int, steps: int | None = None, *also: HealthCheck) -> settings:
    """A property test's settings as the suite runs it, scaled by `POLICYHOOK_DEEP`: `examples`
    examples (a stateful machine's of `steps` steps), the same every run (derandomized), no
    deadline and no too-slow check (real stores and whole guards are slow by nature), nor the
    health checks of `also`."""
    base = settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, *also],
    )
    return scaled(base if steps is None else settings(base, stateful_step_count=steps))
