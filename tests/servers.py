"""Start and stop real servers for end-to-end tests, on 127.0.0.1 and free ports.

A server runs in its own process group with its output in a log file; `start` waits for readiness
with a timeout and fails with the log's tail when the server dies or never gets ready; `stop`
terminates, then kills. A missing binary skips the test, or fails it when CI=true, so CI cannot
pass by skipping what it was meant to run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def missing(what: str, hint: str) -> NoReturn:
    """Skip (locally) or fail (CI=true) because `what` is not installed."""
    message = f"{what} is not installed: {hint}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing server fails the run)", pytrace=False)
    pytest.skip(message)


def executable(candidate: str | Path, what: str, hint: str) -> Path:
    """The executable at `candidate` (a path, or a name looked up on PATH), or skip/fail."""
    text = str(candidate)
    found = shutil.which(text) if os.sep not in text else text
    if found and os.access(found, os.X_OK) and Path(found).is_file():
        return Path(found)
    missing(what, f"{candidate} not found; {hint}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness probe: True once GET `url` answers 200."""

    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    return probe


def get_json(url: str, params: Mapping[str, str] | None = None, timeout: float = 10) -> Any:
    """GET `url` (with query `params`) and decode its JSON body."""
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Server:
    """A server process started by `start`."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            return f"({self.name} log unreadable: {exc})"
        return f"--- last {lines} lines of {self.name} log {self.log} ---\n" + "\n".join(
            text.splitlines()[-lines:]
        )

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM to the server's process group, SIGKILL if it is still there after `timeout`."""
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def start(
    name: str,
    argv: list[str],
    *,
    url: str,
    ready: Callable[[], bool],
    log: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> Server:
    """Start `argv`, wait until `ready()` (polled), or fail with the log tail after `timeout` s."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,  # its own process group: stop() reaches its children too
        )
    server = Server(name, url, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"{name} exited with code {process.returncode} before it was ready\n"
                + server.log_tail(),
                pytrace=False,
            )
        if ready():
            return server
        time.sleep(0.2)
    server.stop()
    pytest.fail(f"{name} not ready within {timeout:.0f}s\n" + server.log_tail(), pytrace=False)


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float, explain: Callable[[], str] = str
) -> Any:
    """Poll `probe()` until it returns something truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.25)
    pytest.fail(f"{what} within {timeout:.0f}s (last: {last!r})\n{explain()}", pytrace=False)
