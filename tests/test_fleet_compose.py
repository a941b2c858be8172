"""The compose `fleet` profile and `policyhook demo --store`: the shared stores as users start them.

Docker does not run here: docker-compose.yml is checked statically (the compose-spec schema check
lives in tests/monitoring/test_compose.py), and the demo runs for real against PostgreSQL and
Redis started by tests/servers.py.
"""

from __future__ import annotations

import contextlib
import io
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import servers
import yaml

from policyhook import MemoryStore, PostgresStore, RedisStore, SQLiteStore, cli
from policyhook.stores import open_store

ROOT = Path(__file__).resolve().parent.parent
STORES_DOC = ROOT / "docs" / "stores.md"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def fleet_services(compose: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in compose["services"].items() if "fleet" in s.get("profiles", ())}


class TestComposeFleetProfile:
    def test_profile_holds_the_stores_and_workers(self, compose: dict[str, Any]) -> None:
        """`--profile fleet` adds Postgres, Redis and the fleet demo; plain `up` starts none of them."""
        fleet = fleet_services(compose)
        assert set(fleet) == {"postgres", "redis", "fleet-demo"}
        assert fleet["postgres"]["image"].startswith("postgres:")
        assert fleet["redis"]["image"].startswith("redis:")
        for name in fleet:
            assert fleet[name]["profiles"] == ["fleet"]

    def test_stores_persist_and_report_health(self, compose: dict[str, Any]) -> None:
        """Both stores keep their data in named volumes (Redis with its AOF) and have healthchecks."""
        fleet = fleet_services(compose)
        for name in ("postgres", "redis"):
            volumes = fleet[name]["volumes"]
            assert any(v.split(":")[0] in compose["volumes"] for v in volumes), name
            assert fleet[name]["healthcheck"]["test"], name
        command = fleet["redis"]["command"]
        assert command[command.index("--appendonly") + 1] == "yes"
        assert command[command.index("--appendfsync") + 1] == "always"  # acknowledged = on disk

    def test_demo_workers_share_the_postgres_service(self, compose: dict[str, Any]) -> None:
        """The fleet demo's POLICYHOOK_STORE names the postgres service with its credentials, and waits for it healthy."""
        fleet = fleet_services(compose)
        demo, postgres = fleet["fleet-demo"], fleet["postgres"]["environment"]
        url = urllib.parse.urlsplit(demo["environment"]["POLICYHOOK_STORE"])
        assert (url.scheme, url.hostname, url.port) == ("postgresql", "postgres", 5432)
        assert (url.username, url.password, url.path) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
            "/" + postgres["POSTGRES_DB"],
        )
        assert demo["deploy"]["replicas"] >= 2
        assert demo["depends_on"]["postgres"]["condition"] == "service_healthy"
        script = "\n".join(demo["command"])
        assert '"/tmp/policyhook[otlp,postgres,redis]"' in script
        assert "collector/demo/loop.py" in script

    def test_ports_are_documented_with_the_stores(self, compose: dict[str, Any]) -> None:
        """docs/stores.md names every port the fleet profile publishes and the compose command."""
        text = STORES_DOC.read_text(encoding="utf-8")
        for service in fleet_services(compose).values():
            for mapping in service.get("ports", ()):
                host = str(mapping).split(":")[0]
                assert re.search(rf"\b{host}\b", text), f"port {host} not in docs/stores.md"
        assert "docker compose --profile fleet up" in text


class TestOpenStore:
    def test_urls_pick_the_store(self, tmp_path: Path) -> None:
        """memory: and sqlite: URLs open those stores; an unknown scheme is a clear error."""
        assert isinstance(open_store("memory:"), MemoryStore)
        store = open_store(f"sqlite://{tmp_path}/a.db")
        assert isinstance(store, SQLiteStore) and store.path == tmp_path / "a.db"
        store.close()
        with pytest.raises(ValueError, match=r"unknown store URL 'mysql://x'.*postgresql://"):
            open_store("mysql://x")


@pytest.fixture(scope="module")
def both() -> Iterator[dict[str, servers.Restartable]]:
    pg, r = servers.postgres(), servers.redis()
    yield {"postgres": pg, "redis": r}
    servers.remove(pg)
    servers.remove(r)


def demo(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["demo", "--no-otlp", *argv])
    return code, out.getvalue(), err.getvalue()


class TestDemoOnSharedStores:
    @pytest.mark.parametrize("kind", ["postgres", "redis"])
    def test_demo_runs_the_same_on_a_shared_store_twice(
        self, kind: str, both: dict[str, servers.Restartable]
    ) -> None:
        """`policyhook demo --store URL` prints the in-memory run's table, and again on the now-used store."""
        code, expected, _ = demo()
        assert code == 0
        for _ in range(2):
            code, got, err = demo("--store", both[kind].url)
            assert (code, err) == (0, "")
            assert got == expected
        store: Any = open_store(both[kind].url)
        assert isinstance(store, PostgresStore if kind == "postgres" else RedisStore)
        assert store.states(["cfg-retry-ceiling"]) == {"cfg-retry-ceiling": "evicted"}
        store.close()

    def test_store_from_the_environment(
        self, both: dict[str, servers.Restartable], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """POLICYHOOK_STORE sets the demo's store when --store is not given."""
        monkeypatch.setenv("POLICYHOOK_STORE", both["redis"].url.replace("/0", "/1"))
        assert demo()[0] == 0
        store: Any = open_store(both["redis"].url.replace("/0", "/1"))
        assert store.states(["cfg-retry-ceiling"]) == {"cfg-retry-ceiling": "evicted"}
        store.close()

    def test_unreachable_store_is_a_usage_error(self) -> None:
        """A store that cannot be reached exits 2 with the store's reason, before any pass."""
        port = servers.free_port()
        code, out, err = demo("--store", f"redis://127.0.0.1:{port}/0")
        assert code == 2 and out == ""
        assert f"127.0.0.1:{port}" in err and "--store" in err and "Connection refused" in err
