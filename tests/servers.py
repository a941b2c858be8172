"""Start and stop real servers for end-to-end tests, on 127.0.0.1 and free ports.

A server runs in its own process group with its output in a log file; `start` waits for readiness
with a timeout and fails with the log's tail when the server dies or never gets ready; `stop`
terminates, then kills. A missing binary skips the test, or fails it when CI=true, so CI cannot
pass by skipping what it was meant to run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
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
    user: str | None = None,
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
            user=user,  # PostgreSQL refuses root: as root, run it as its system user
            group=user,
            extra_groups=[] if user is not None else None,
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


# -- PostgreSQL and Redis: the shared stores' servers (tests/test_fleet*.py) --------------------

SETUP_HINT = "run .ci/setup-servers (apt-get install postgresql redis-server)"


def postgres_binary(name: str) -> Path:
    """`name` from Debian's newest /usr/lib/postgresql/N/bin (not on PATH there), else PATH."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for folder in reversed(versions):
        if (folder / name).is_file():
            return executable(folder / name, "PostgreSQL", SETUP_HINT)
    return executable(name, "PostgreSQL", SETUP_HINT)


def _tcp_answer(port: int, send: bytes, expect: bytes) -> Callable[[], bool]:
    """A readiness probe: True once 127.0.0.1:`port` answers `send` with bytes starting `expect`."""

    def probe() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(send)
                return s.recv(64).startswith(expect)
        except OSError:
            return False

    return probe


@dataclass
class Restartable:
    """A server with its data in `data`, on a fixed port: stopped, killed and started again.

    What the fault tests need: the same address and the same data after a restart, so a store
    that reconnects finds everything it recorded before.
    """

    name: str
    argv: list[str]
    url: str
    data: Path
    ready: Callable[[], bool]
    user: str | None = None
    server: Server | None = None
    starts: int = 0

    def start(self, timeout: float = 60) -> Server:
        self.starts += 1
        log = self.data.parent / f"{self.name}-{self.starts}.log"
        self.server = start(
            self.name,
            self.argv,
            url=self.url,
            ready=self.ready,
            log=log,
            timeout=timeout,
            cwd=self.data.parent,
            user=self.user,
        )
        return self.server

    def stop(self) -> None:
        """A clean shutdown (SIGTERM to the process group)."""
        if self.server is not None:
            self.server.stop()

    def processes(self) -> list[int]:
        """The server's process and all its descendants (PostgreSQL's backends each call
        setsid(), so its process group alone would miss them)."""
        if self.server is None or self.server.process.poll() is not None:
            return []
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rpartition(")")[2].split()
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, todo = [], [self.server.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return found

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to every process of the server (SIGSTOP: a hung server; SIGCONT: back)."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self) -> None:
        """A crash: SIGKILL to every process of the server at once, no shutdown of any kind."""
        if self.server is not None and self.server.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.server.process.wait(10)

    def log_tail(self) -> str:
        return self.server.log_tail() if self.server is not None else f"({self.name} not started)"


def _owned_tempdir(prefix: str, user: str | None) -> Path:
    """A fresh temp dir that `user` (or we) own; /tmp so a dropped-privilege server can reach it."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if user is not None:
        shutil.chown(path, user, user)
    return path


def postgres(root: Path | None = None) -> Restartable:
    """A new PostgreSQL cluster on 127.0.0.1 and a free port, started; trust auth, user postgres.

    PostgreSQL refuses to run as root: as root (CI), initdb and the server run as the `postgres`
    system user that Debian's package creates, with a data dir that user owns. No Unix socket
    (nothing outside the temp dir is touched); fsync off (a killed server still keeps every
    commit: the OS holds the WAL it wrote, only a machine crash could lose it).
    """
    initdb, server = postgres_binary("initdb"), postgres_binary("postgres")
    user = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            missing("the postgres system user", SETUP_HINT)
        user = "postgres"
    base = _owned_tempdir("policyhook-pg-", user) if root is None else root
    data = base / "data"
    subprocess.run(
        [str(initdb), "-D", str(data), "--auth=trust", "--username=postgres", "--encoding=UTF8",
         "--no-instructions", "--no-sync"],
        check=True, capture_output=True, cwd=base, user=user, group=user,
    )  # fmt: skip
    port = free_port()
    managed = Restartable(
        "postgres",
        [str(server), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", "",
         "-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB"],
        url=f"postgresql://postgres@127.0.0.1:{port}/postgres",
        data=data,
        ready=_pg_ready(port),
        user=user,
    )  # fmt: skip
    managed.start()
    return managed


def _pg_ready(port: int) -> Callable[[], bool]:
    isready = postgres_binary("pg_isready")

    def probe() -> bool:
        argv = [str(isready), "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
        return subprocess.run(argv, check=False, timeout=10).returncode == 0

    return probe


def redis(root: Path | None = None) -> Restartable:
    """A new Redis on 127.0.0.1 and a free port, started, with an append-only file in a temp dir.

    appendfsync always: a killed and restarted Redis still has every write it acknowledged. With
    the default `everysec`, a busy disk makes Redis postpone the AOF write (up to 2 s) while it
    still replies, so a SIGKILL can lose acknowledged writes (seen once in a full run).
    """
    binary = executable("redis-server", "Redis", SETUP_HINT)
    base = _owned_tempdir("policyhook-redis-", None) if root is None else root
    data = base / "data"
    data.mkdir()
    port = free_port()
    managed = Restartable(
        "redis",
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
         "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no",
         "--daemonize", "no"],
        url=f"redis://127.0.0.1:{port}/0",
        data=data,
        ready=_tcp_answer(port, b"PING\r\n", b"+PONG"),
    )  # fmt: skip
    managed.start()
    return managed


def remove(managed: Restartable) -> None:
    """Stop `managed` and delete its temp dir."""
    managed.stop()
    shutil.rmtree(managed.data.parent, ignore_errors=True)


def redis_cluster(size: int = 3) -> list[Restartable]:
    """A Redis Cluster of `size` masters on 127.0.0.1 (free ports, bus ports free too), ready."""
    binary = executable("redis-server", "Redis", SETUP_HINT)
    cli = executable("redis-cli", "Redis", SETUP_HINT)
    base = _owned_tempdir("policyhook-redis-cluster-", None)
    nodes: list[Restartable] = []
    while len(nodes) < size:
        port = free_port()
        if port + 10000 > 65535 or not _port_free(port + 10000):
            continue  # the cluster bus listens on port + 10000
        data = base / f"node{len(nodes)}"
        data.mkdir()
        node = Restartable(
            f"redis-cluster-{len(nodes)}",
            [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no"],
            url=f"redis://127.0.0.1:{port}/0",
            data=data,
            ready=_tcp_answer(port, b"PING\r\n", b"+PONG"),
        )  # fmt: skip
        node.start()
        nodes.append(node)
    addresses = [n.url.removeprefix("redis://").removesuffix("/0") for n in nodes]
    create = [str(cli), "--cluster", "create", *addresses, "--cluster-replicas", "0"]
    done = subprocess.run(
        [*create, "--cluster-yes"], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        for node in nodes:
            node.stop()
        pytest.fail(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
    for node in nodes:
        node_port = node.url.rsplit(":", 1)[1].split("/")[0]
        wait_for(
            f"{node.name} in a cluster with every slot served",
            functools.partial(_cluster_ok, cli, node_port),
            timeout=30,
            explain=node.log_tail,
        )
    return nodes


def _cluster_ok(cli: Path, port: str) -> bool:
    info = [str(cli), "-p", port, "cluster", "info"]
    return b"cluster_state:ok" in subprocess.run(info, capture_output=True, timeout=10).stdout


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
