"""Shared fixtures: every policy test runs under each installed CEL backend; real Postgres and
Redis servers for the store tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import servers

from policyhook import _backends as backends
from policyhook import _cel as cel
from policyhook._loader import compile_sources
from policyhook._policy import PolicySet


def _backends() -> list[cel.Backend]:
    return backends.available_backends()


@pytest.fixture(params=_backends(), ids=lambda b: b.name)
def backend(request: pytest.FixtureRequest) -> cel.Backend:
    """A CEL backend; tests using it run once per installed backend."""
    backend: cel.Backend = request.param
    return backend


@pytest.fixture
def compile_policy(backend: cel.Backend) -> Callable[..., PolicySet]:
    """Compile YAML text (one or more documents) with the parametrised backend."""

    def compile_(text: str, name: str = "policy.yaml", **options: object) -> PolicySet:
        return compile_sources([(name, text)], backend=backend, **options)  # type: ignore[arg-type]

    return compile_


@pytest.fixture(autouse=True)
def no_force_audit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests that expect enforcement must not inherit a shadow-rollout switch from the shell."""
    monkeypatch.delenv("POLICYHOOK_FORCE_AUDIT", raising=False)
    yield


# Real servers, each started once per test module that asks for it (tests/servers.py).
@pytest.fixture(scope="module")
def postgres() -> Iterator[servers.Restartable]:
    server = servers.postgres()
    yield server
    servers.remove(server)


@pytest.fixture(scope="module")
def redis() -> Iterator[servers.Restartable]:
    server = servers.redis()
    yield server
    servers.remove(server)
