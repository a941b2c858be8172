"""Hot reload: new files take effect between decisions, bad ones keep the last good set."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from policyhook import Guard
from policyhook._reload import PolicyWatcher
from policyhook.testing import capture_decisions


def generation(n: int) -> str:
    """Two audit policies whose refusal messages carry the generation that wrote them."""
    docs = []
    for name in ("first", "second"):
        docs.append(
            "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\n"
            f"metadata: {{name: {name}}}\nspec:\n  mode: audit\n  rules:\n"
            f"    - name: always\n      expression: 'false'\n      message: gen {n}\n"
        )
    return "\n---\n".join(docs)


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    (tmp_path / "p.yaml").write_text(generation(1))
    return tmp_path


class TestWatcher:
    def test_picks_up_changes(self, policy_dir: Path) -> None:
        """An edited file is compiled and put in force; the revision changes."""
        outcomes: list[tuple[str, str]] = []
        watcher = PolicyWatcher(
            policy_dir, interval=0, on_reload=lambda o, r: outcomes.append((o, r))
        )
        old = watcher.current.revision
        assert watcher.check() is False  # nothing changed
        (policy_dir / "p.yaml").write_text(generation(2))
        assert watcher.check() is True
        assert watcher.current.revision != old
        assert outcomes == [("success", watcher.current.revision)]

    def test_bad_file_keeps_last_good_set(
        self, policy_dir: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A broken edit is logged and counted as a failure; the last good set stays in force."""
        outcomes: list[tuple[str, str]] = []
        watcher = PolicyWatcher(
            policy_dir, interval=0, on_reload=lambda o, r: outcomes.append((o, r))
        )
        good = watcher.current
        (policy_dir / "p.yaml").write_text(generation(2).replace("'false'", "region.nope"))
        assert watcher.check() is False
        assert watcher.current is good
        assert outcomes == [("failure", good.revision)]
        assert "keeping revision" in caplog.text and "region has no field 'nope'" in caplog.text
        assert watcher.check() is False  # the same bad revision is reported once
        assert len(outcomes) == 1
        (policy_dir / "p.yaml").write_text(generation(3))
        assert watcher.check() is True
        assert outcomes[-1][0] == "success"

    def test_deleted_files_keep_last_good_set(self, policy_dir: Path) -> None:
        """Removing every policy file is a failed reload, not an allow-all set."""
        watcher = PolicyWatcher(policy_dir, interval=0)
        good = watcher.current
        (policy_dir / "p.yaml").unlink()
        assert watcher.check() is False
        assert watcher.current is good

    def test_polling_thread_reloads(self, policy_dir: Path) -> None:
        """A guard built from a path follows edits by itself while running."""
        guard = Guard.from_path(policy_dir, reload_interval=0.05)
        try:
            before = guard.policies.revision
            (policy_dir / "p.yaml").write_text(generation(2))
            reloaded = threading.Event()
            for _ in range(100):
                if guard.policies.revision != before:
                    reloaded.set()
                    break
                reloaded.wait(0.05)
            assert reloaded.is_set()
            assert guard.check("text", summarizer="s").message == "gen 2"
        finally:
            guard.close()


def test_concurrent_calls_each_see_one_complete_revision(policy_dir: Path) -> None:
    """While reloads happen, no decision is lost and none mixes two revisions."""
    guard = Guard.from_path(policy_dir, reload_interval=0)
    summarize = guard(lambda text: text, summarizer="s")
    calls_per_thread, threads = 60, 4
    stop = threading.Event()
    reloads = [0]  # reloads completed so far
    calls: list[int] = []
    deadline = time.monotonic() + 60  # a starved reloader fails the test, never hangs it

    def reload_loop() -> None:
        n = 1
        while not stop.is_set():
            n += 1
            (policy_dir / "p.yaml").write_text(generation(n))
            guard.reload()
            reloads[0] += 1

    def call_loop() -> None:
        """At least `calls_per_thread` calls, and one more after two reloads completed since
        this worker began: its first and last calls see different revisions however fast
        decisions are (an allow kept made them fast enough to finish before any reload)."""
        began, made = reloads[0], 0
        while made < calls_per_thread or reloads[0] < began + 2:
            assert time.monotonic() < deadline, "the reloader never ran during the calls"
            summarize("some original text")
            made += 1
        summarize("some original text")
        calls.append(made + 1)

    with capture_decisions(guard) as seen:
        reloader = threading.Thread(target=reload_loop)
        workers = [threading.Thread(target=call_loop) for _ in range(threads)]
        reloader.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        reloader.join()

    assert len(calls) == threads
    assert len(seen) == sum(calls)  # no decision lost
    generations_by_revision: dict[str, set[str]] = {}
    for decision, _ in seen:
        messages = {v.message for v in decision.violations}
        assert len(decision.violations) == 2 and len(messages) == 1  # both policies, one generation
        generations_by_revision.setdefault(decision.revision, set()).update(messages)
    assert all(len(g) == 1 for g in generations_by_revision.values())
    assert len(generations_by_revision) > 1  # reloads really happened during the calls


class TestHostileEdits:
    def test_alias_bomb_is_a_counted_failure(self, policy_dir: Path) -> None:
        """A YAML bomb written over a watched file fails the reload at once; the last set stays."""
        outcomes: list[tuple[str, str]] = []
        watcher = PolicyWatcher(
            policy_dir, interval=0, on_reload=lambda o, r: outcomes.append((o, r))
        )
        good = watcher.current
        bomb = "".join(
            f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9)
        )
        (policy_dir / "p.yaml").write_text(bomb + generation(2))
        assert watcher.check() is False
        assert watcher.current is good
        assert outcomes == [("failure", good.revision)]
        assert watcher.last_error is not None
        assert "p.yaml:1:" in str(watcher.last_error) and "anchors" in str(watcher.last_error)

    def test_deep_nesting_is_a_counted_failure(self, policy_dir: Path) -> None:
        """Thousands of nested mappings fail the reload as a PolicyError, not a RecursionError."""
        outcomes: list[str] = []
        watcher = PolicyWatcher(policy_dir, interval=0, on_reload=lambda o, r: outcomes.append(o))
        (policy_dir / "p.yaml").write_text("{a: " * 5000 + "x" + "}" * 5000)
        assert watcher.check() is False
        assert outcomes == ["failure"]
        assert "nesting deeper than" in str(watcher.last_error)

    def test_fifo_appearing_later_fails_the_reload_and_stop_is_prompt(
        self, policy_dir: Path
    ) -> None:
        """A FIFO *.yaml appearing in a watched folder is a failed reload; stop() does not wait."""
        outcomes: list[str] = []
        watcher = PolicyWatcher(
            policy_dir, interval=0.02, on_reload=lambda o, r: outcomes.append(o)
        ).start()
        good = watcher.current
        os.mkfifo(policy_dir / "late.yaml")
        failed = threading.Event()
        for _ in range(250):  # (the listener is told after `last_error` is set: wait for both)
            if watcher.last_error is not None and outcomes:
                failed.set()
                break
            failed.wait(0.02)
        assert failed.is_set(), "the reload thread never reported the FIFO"
        assert "late.yaml: io: a FIFO" in str(watcher.last_error)
        assert watcher.current is good and outcomes == ["failure"]
        stopper = threading.Thread(target=watcher.stop)
        stopper.start()
        stopper.join(3)
        assert not stopper.is_alive(), "stop() is waiting on the reload thread"
