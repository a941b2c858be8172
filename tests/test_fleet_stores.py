"""PostgresStore and RedisStore against real servers: the Store contract, schema, and faults.

Each server is started on 127.0.0.1 on a free port with a temp data dir (tests/servers.py) and
stopped at the end; missing binaries skip locally and fail with CI=true (.ci/setup-servers
installs them). Each store made here gets its own schema / key namespace, so tests never see
each other's data.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import servers
from store_contract import MakeStore, Reopen, StoreContract, summary

from policyhook.stores import Store

_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


class TestPostgresStoreContract(StoreContract):
    @pytest.fixture
    def make_store(self, postgres: servers.Restartable) -> Iterator[MakeStore]:
        from policyhook._postgres import PostgresStore

        opened: list[PostgresStore] = []

        def make(**options: Any) -> PostgresStore:
            opened.append(PostgresStore(postgres.url, schema=fresh("contract_"), **options))
            return opened[-1]

        yield make
        for s in opened:
            s.close()

    @pytest.fixture
    def reopen(self, postgres: servers.Restartable) -> Iterator[Reopen]:
        from policyhook._postgres import PostgresStore

        opened: list[PostgresStore] = []

        def again(store: Store) -> PostgresStore:
            assert isinstance(store, PostgresStore)
            opened.append(PostgresStore(postgres.url, schema=store.schema, ttl=store.ttl))
            return opened[-1]

        yield again
        for s in opened:
            s.close()


class TestRedisStoreContract(StoreContract):
    @pytest.fixture
    def make_store(self, redis: servers.Restartable) -> Iterator[MakeStore]:
        from policyhook._redis import RedisStore

        opened: list[RedisStore] = []

        def make(**options: Any) -> RedisStore:
            opened.append(RedisStore(redis.url, namespace=fresh("contract"), **options))
            return opened[-1]

        yield make
        for s in opened:
            s.close()

    @pytest.fixture
    def reopen(self, redis: servers.Restartable) -> Iterator[Reopen]:
        from policyhook._redis import RedisStore

        opened: list[RedisStore] = []

        def again(store: Store) -> RedisStore:
            assert isinstance(store, RedisStore)
            opened.append(RedisStore(redis.url, namespace=store.namespace, ttl=store.ttl))
            return opened[-1]

        yield again
        for s in opened:
            s.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[servers.Restartable]]:
    nodes = servers.redis_cluster(3)
    yield nodes
    for node in nodes:
        servers.remove(node)


class TestRedisClusterContract(StoreContract):
    """The same contract on a three-master Redis Cluster: every key of a store shares one hash
    tag, so every script and multi-key command lands on one node."""

    @pytest.fixture
    def make_store(self, cluster: list[servers.Restartable]) -> Iterator[MakeStore]:
        from redis.cluster import RedisCluster

        from policyhook._redis import RedisStore

        clients: list[Any] = []

        def make(**options: Any) -> RedisStore:
            clients.append(RedisCluster.from_url(cluster[0].url))
            return RedisStore(client=clients[-1], namespace=fresh("cluster"), **options)

        yield make
        for c in clients:
            c.close()

    @pytest.fixture
    def reopen(self, cluster: list[servers.Restartable]) -> Iterator[Reopen]:
        from redis.cluster import RedisCluster

        from policyhook._redis import RedisStore

        clients: list[Any] = []

        def again(store: Store) -> RedisStore:
            assert isinstance(store, RedisStore)
            clients.append(RedisCluster.from_url(cluster[-1].url))  # another node first
            return RedisStore(client=clients[-1], namespace=store.namespace, ttl=store.ttl)

        yield again
        for c in clients:
            c.close()

    def test_namespaces_spread_over_the_nodes(self, cluster: list[servers.Restartable]) -> None:
        """Different namespaces hash to different slots, so stores spread over the masters."""
        from redis.cluster import RedisCluster
        from redis.crc import key_slot  # what RedisCluster.keyslot computes, typed

        client = RedisCluster.from_url(cluster[0].url)
        slots = {key_slot(("{" + f"tenant{i}" + "}:live").encode()) for i in range(30)}
        owners = {client.nodes_manager.get_node_from_slot(s).port for s in slots}
        client.close()
        assert len(owners) == 3


class TestSchemaVersions:
    """Each shared store migrates an older layout on open and refuses a newer one."""

    def test_postgres_schema_1_gains_fact_provenance(self, postgres: servers.Restartable) -> None:
        """A version-1 schema (before per-fact provenance) is migrated on open, data kept."""
        import psycopg

        from policyhook._postgres import SCHEMA_VERSION, PostgresStore
        from policyhook._provenance import Source

        name = fresh("migrate_")
        with PostgresStore(postgres.url, schema=name) as store:
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        with psycopg.connect(postgres.url, autocommit=True) as conn:  # back to version 1
            conn.execute(f"DROP TABLE {name}.facts")
            conn.execute(f"UPDATE {name}.meta SET value = '1' WHERE key = 'version'")
        with PostgresStore(postgres.url, schema=name) as store:
            assert store.schema_version() == SCHEMA_VERSION == 3
            assert store.get_source("cfg") == "retry_ceiling: 7"
            entry = summary(store, "retries are capped at 7", sources=("cfg",))
            store.put_summary(entry, "retries are capped at 7", [("n:7", ("cfg",))])
            assert store.facts([entry.id]) == {entry.id: [("n:7", ("cfg",))]}

    def test_postgres_schema_2_ids_name_one_text(self, postgres: servers.Restartable) -> None:
        """A version-2 schema (when an id could take another text) is raised to 3 on open,
        and the ids it holds and buried already name their text: another is refused."""
        import psycopg

        from policyhook import SourceIdConflictError
        from policyhook._postgres import SCHEMA_VERSION, PostgresStore
        from policyhook._provenance import Source

        name = fresh("migrate_")
        with PostgresStore(postgres.url, schema=name) as store:
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
            store.put_source(Source("doc", "config_read"), "timeout: 30")
            store.evict("doc")
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute(f"UPDATE {name}.meta SET value = '2' WHERE key = 'version'")
        with PostgresStore(postgres.url, schema=name) as store:
            assert store.schema_version() == SCHEMA_VERSION == 3
            for source_id, state in (("cfg", "live"), ("doc", "evicted")):
                with pytest.raises(SourceIdConflictError, match=f"now {state}"):
                    store.put_source(Source(source_id, "config_read"), "another text")
            store.put_source(Source("doc", "config_read"), "timeout: 30")
            assert store.live(["cfg", "doc"]) == {"cfg", "doc"}

    def test_postgres_newer_schema_is_refused(self, postgres: servers.Restartable) -> None:
        import psycopg

        from policyhook._errors import StoreUnavailableError
        from policyhook._postgres import PostgresStore

        name = fresh("newer_")
        PostgresStore(postgres.url, schema=name).close()
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute(f"UPDATE {name}.meta SET value = '99' WHERE key = 'version'")
        with pytest.raises(StoreUnavailableError, match=r"version 99 .*upgrade policyhook"):
            PostgresStore(postgres.url, schema=name)

    def test_redis_layout_1_gains_fact_provenance(self, redis: servers.Restartable) -> None:
        """A version-1 layout is raised to the current one on open (it only added keys)."""
        from policyhook._provenance import Source
        from policyhook._redis import SCHEMA_VERSION, RedisStore

        name = fresh("migrate")
        with RedisStore(redis.url, namespace=name) as store:
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
            store._client.hset(store._k["meta"], "version", 1)
            assert store.schema_version() == 1
        with RedisStore(redis.url, namespace=name) as store:
            assert store.schema_version() == SCHEMA_VERSION == 3
            assert store.get_source("cfg") == "retry_ceiling: 7"
            entry = summary(store, "retries are capped at 7", sources=("cfg",))
            store.put_summary(entry, "retries are capped at 7", [("n:7", ("cfg",))])
            assert store.facts([entry.id]) == {entry.id: [("n:7", ("cfg",))]}

    def test_redis_layout_2_ids_name_one_text(self, redis: servers.Restartable) -> None:
        """A version-2 layout (when an id could take another text) is raised to 3 on open,
        and the ids it holds and buried already name their text: another is refused."""
        from policyhook import SourceIdConflictError
        from policyhook._provenance import Source
        from policyhook._redis import SCHEMA_VERSION, RedisStore

        name = fresh("migrate")
        with RedisStore(redis.url, namespace=name) as store:
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
            store.put_source(Source("doc", "config_read"), "timeout: 30")
            store.evict("doc")
            store._client.hset(store._k["meta"], "version", 2)
        with RedisStore(redis.url, namespace=name) as store:
            assert store.schema_version() == SCHEMA_VERSION == 3
            for source_id, state in (("cfg", "live"), ("doc", "evicted")):
                with pytest.raises(SourceIdConflictError, match=f"now {state}"):
                    store.put_source(Source(source_id, "config_read"), "another text")
            store.put_source(Source("doc", "config_read"), "timeout: 30")
            assert store.live(["cfg", "doc"]) == {"cfg", "doc"}

    def test_redis_newer_layout_is_refused(self, redis: servers.Restartable) -> None:
        from policyhook._errors import StoreUnavailableError
        from policyhook._redis import RedisStore

        name = fresh("newer")
        with RedisStore(redis.url, namespace=name) as store:
            store._client.hset(store._k["meta"], "version", 99)
        with pytest.raises(StoreUnavailableError, match=r"version 99 .*upgrade policyhook"):
            RedisStore(redis.url, namespace=name)
