"""`POLICYHOOK_DEEP` (tests/deep.py): the property tests run deeper on demand, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import deep
import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parent
BASE = settings(
    max_examples=45,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_the_suite_runs_its_own_settings_when_unset() -> None:
    assert deep.factor({}) == 0 and deep.factor({"POLICYHOOK_DEEP": " "}) == 0
    assert deep.scaled(BASE, 0) is BASE


def test_deeper_is_more_examples_longer_randomized_and_replayable() -> None:
    deeper = deep.scaled(BASE, 20)
    assert deeper.max_examples == 900 and deeper.stateful_step_count == 60
    assert not deeper.derandomize and deeper.database is None and deeper.print_blob
    assert deeper.deadline is None and deeper.suppress_health_check == BASE.suppress_health_check


def test_the_suites_settings_scale_with_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(deep.VARIABLE, raising=False)
    own = deep.suite(45, 30, HealthCheck.filter_too_much)
    assert (own.max_examples, own.stateful_step_count, own.derandomize) == (45, 30, True)
    assert own.deadline is None
    assert set(own.suppress_health_check) == {HealthCheck.too_slow, HealthCheck.filter_too_much}
    monkeypatch.setenv(deep.VARIABLE, "4")
    deeper = deep.suite(45, 30, HealthCheck.filter_too_much)
    assert (deeper.max_examples, deeper.stateful_step_count, deeper.derandomize) == (180, 60, False)
    assert deep.suite(150).max_examples == 600


@pytest.mark.parametrize("raw", ["0", "-3", "ten", "2.5"])
def test_a_bad_depth_names_the_variable_and_the_value(raw: str) -> None:
    with pytest.raises(ValueError, match=rf"POLICYHOOK_DEEP='{raw}': a whole number >= 1"):
        deep.factor({"POLICYHOOK_DEEP": raw})


def test_the_stateful_machines_take_it() -> None:
    """Read from the environment when the test modules are imported, as pytest imports them."""
    script = (
        "import test_property_allow as a, test_stores as s;"
        "print(a.Provenance.TestCase.settings.max_examples,"
        " s.TwoConnections.TestCase.settings.max_examples)"
    )
    env = {**os.environ, "POLICYHOOK_DEEP": "3", "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["135", "240"]


def test_contributing_says_how() -> None:
    text = (TESTS.parent / "CONTRIBUTING.md").read_text()
    assert f"{deep.VARIABLE}=20 .venv/bin/python -m pytest" in text
