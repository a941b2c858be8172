"""Fixtures shared by the monitoring-stack tests (compose, collector, rules, Grafana datasources)."""

from __future__ import annotations

from typing import Any

import pytest
from monitoring_support import COMPOSE, DATASOURCES, OTELCOL_CONFIG, RULES, load_mapping, load_yaml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_mapping(COMPOSE)


@pytest.fixture(scope="module")
def otelcol() -> dict[str, Any]:
    return load_mapping(OTELCOL_CONFIG)


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return load_mapping(RULES)


@pytest.fixture(scope="module")
def datasources() -> dict[str, dict[str, Any]]:
    return {d["uid"]: d for d in load_yaml(DATASOURCES)["datasources"]}
