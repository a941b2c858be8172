"""A fleet: four worker processes, each with its own Guard, sharing one store.

What a fleet relies on (issue 17): a source evicted by one worker is dead to every worker at its
next decision; a summary made by one worker is recognised as a summary (with its sources) by the
others, even by workers that had already cached the window; a store server killed mid-run makes
decisions fail closed, and when it is back the fleet carries on with nothing lost. Run on
PostgreSQL, Redis, and SQLite (one file shared by processes) for comparison.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import servers
from fleet_workers import Spec, Worker, fleet

CONFIG = "config/agent.yaml: retry_ceiling: 7  # max retries for flaky tool calls"
TURN = "user: the deploy step keeps timing out, please keep retrying it"
LATER = "tool(deploy): timeout after 30s (attempt 3)"
WINDOW = "session-42"
_names = itertools.count()


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Worker]]:
    with fleet(4) as running:
        yield running


@pytest.fixture(params=["postgres", "redis", "sqlite"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Spec:
    """A fresh shared store: its own schema / namespace / file."""
    name = f"fleet_{next(_names)}"
    if request.param == "sqlite":
        return ("sqlite", str(tmp_path / "fleet.db"), name)
    server: servers.Restartable = request.getfixturevalue(request.param)
    return (request.param, server.url, name)


@pytest.fixture(params=["postgres", "redis"])
def served(request: pytest.FixtureRequest) -> tuple[Spec, servers.Restartable]:
    """A fresh shared store on a server, and the server (to kill)."""
    server: servers.Restartable = request.getfixturevalue(request.param)
    return (request.param, server.url, f"fleet_{next(_names)}"), server


#: Output-phase policies only: a number the summary states must have a live source.
FACT_POLICIES = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata:
  name: facts
spec:
  mode: enforce
  phase: output
  failurePolicy: deny
  rules:
    - name: grounded
      expression: '!("number" in summary.ungrounded_kinds)'
      message: the summary states numbers no source states
    - name: verifiable
      expression: '!("number" in summary.unverifiable_kinds)'
      message: the summary states numbers only dead sources state
"""


def open_all(
    workers: list[Worker], spec: Spec, timeout: float = 2.0, policies: str | None = None
) -> None:
    for w in workers:
        w.drain()
    for w in workers:
        w.send("open", spec, timeout, policies)
    for w in workers:
        assert w.answer() == "ok"


class TestFleet:
    def test_summaries_and_evictions_are_seen_by_every_worker(
        self, workers: list[Worker], shared: Spec
    ) -> None:
        """A summary made by worker 1 is a depth-1 summary to workers 0, 2, 3; cfg evicted by worker 3 is dead to all at their next decision."""
        open_all(workers, shared)
        w0, w1, w2, w3 = workers
        assert w0("record", CONFIG, "config_read", "cfg") == "cfg"
        assert w0("record", TURN, "user_turn", "turn-1") == "turn-1"
        assert w2("record", LATER, "tool_output", "tool-3") == "tool-3"
        for w in workers:  # every worker has the window cached before the summary exists
            assert w("check", [CONFIG, TURN], WINDOW) == ("allow", 0, ())

        outcome, summary = w1("summarize", [CONFIG, TURN], WINDOW)
        assert outcome == "granted"
        for w in (w0, w2, w3):
            assert w("check", [summary, LATER], WINDOW) == ("allow", 1, ())

        assert w3("evict", "cfg") is True
        for w in workers:
            effect, depth, dead = w("check", [summary, LATER], WINDOW)
            assert (effect, depth, dead) == ("deny", 1, ("cfg",)), f"worker {w.number}"
        assert w2("summarize", [summary, LATER], WINDOW) == ("refused", ("cfg",))

    def test_fact_provenance_is_shared_and_dies_with_its_sources(
        self, workers: list[Worker], shared: Spec, tmp_path: Path
    ) -> None:
        """The per-fact provenance worker 1 records with its summary is read by every worker; once worker 3 evicts cfg, the number only cfg stated is unverifiable for all (not ungrounded: they know where it came from)."""
        policies = tmp_path / "facts.yaml"
        policies.write_text(FACT_POLICIES)
        open_all(workers, shared, policies=str(policies))
        w0, w1, w2, w3 = workers
        w0("record", CONFIG, "config_read", "cfg")
        w0("record", TURN, "user_turn", "turn-1")
        w2("record", LATER, "tool_output", "tool-3")
        said = "Deploy: retry_ceiling 7 for flaky tool calls."
        assert w1("summarize", [CONFIG, TURN], WINDOW, said) == ("granted", said)
        for w in workers:
            facts = dict(w("facts", said))
            assert set(facts.values()) == {("cfg",)} and any('"7"' in f for f in facts), facts

        again = said + " Timeout after 30s."
        assert w2("summarize", [said, LATER], WINDOW, again) == ("granted", again)
        assert w3("evict", "cfg") is True
        for w in workers:
            outcome, why = w("summarize", [said, LATER], WINDOW, again)
            assert outcome == "refused", f"worker {w.number}: {why}"
            assert "only dead sources" in why and "unverifiable: " in why and "7" in why, why
            assert "ungrounded" not in why, f"worker {w.number}: {why}"

    def test_server_killed_and_restarted_mid_run(
        self, workers: list[Worker], served: tuple[Spec, servers.Restartable]
    ) -> None:
        """Server killed: every worker's decision fails closed; restarted: the same decisions allow again, with the same provenance."""
        spec, server = served
        open_all(workers, spec, timeout=1.0)
        w0, w1, *_ = workers
        w0("record", CONFIG, "config_read", "cfg")
        w0("record", TURN, "user_turn", "turn-1")
        w0("record", LATER, "tool_output", "tool-3")
        outcome, summary = w1("summarize", [CONFIG, TURN], WINDOW)
        assert outcome == "granted"
        for w in workers:
            assert w("check", [summary, LATER], WINDOW) == ("allow", 1, ())

        server.kill()
        try:
            for w in workers:
                # What the store cannot confirm is dead: the sources, or the summary itself
                # when even recognising it needs the store.
                effect, _, dead = w("check", [summary, LATER], WINDOW)
                assert effect == "deny" and dead, f"worker {w.number}: {effect} {dead}"
        finally:
            server.start()
        for w in workers:
            assert w("check", [summary, LATER], WINDOW) == ("allow", 1, ()), f"worker {w.number}"
        outcome, second = w0("summarize", [summary, LATER], WINDOW)
        assert outcome == "granted"
        assert workers[3]("check", [second], WINDOW)[:2] == ("allow", 2)
