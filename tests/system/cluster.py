"""A throwaway PostgreSQL cluster on 127.0.0.1 for failover tests: one etcd and two PostgreSQL 15
nodes under Patroni, configured from ``deploy/`` (docs/FAILOVER.md), in a temporary directory.

``PatroniCluster`` is a context manager: entering starts etcd and the nodes on free ports and
waits for a leader and a synchronous standby; leaving kills every process it started (and every
process PostgreSQL forked), checks that none is left and removes the directory, also when the
test failed (then it prints the tails of the logs first). A test process killed outright leaves
no process either (Patroni and etcd get SIGTERM when it dies), only its directory
(``/tmp/billing-pg-*``). PostgreSQL refuses to run as root: as root the processes run as the
``postgres`` user, in a directory it owns.

Try it by hand: ``.venv/bin/python -m tests.system.cluster`` prints the URLs and keeps the
cluster up until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import psycopg
from psycopg import sql

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
HOST = "127.0.0.1"
#: The account PostgreSQL runs as when the tests run as root.
SERVICE_USER = "postgres"
#: The libpq options of the multi-host URL (docs/FAILOVER.md): only the read-write primary will
#: do, and a host that does not answer is given up after 3 s (psycopg tries the hosts in turn,
#: each with the whole ``connect_timeout``; its default is 130 s).
MULTI_HOST_OPTIONS = "target_session_attrs=read-write&connect_timeout=3"
#: Seconds between two looks at the cluster while waiting: no busy loop on a shared machine.
POLL = 0.2

T = TypeVar("T")

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_SIGTERM = int(signal.SIGTERM)


def _die_with_parent() -> None:
    """In a child between fork and exec (after its switch of user, which would clear it):
    SIGTERM it when the thread that started it dies. A test process killed outright (SIGKILL, a
    CI timeout) then leaves no cluster running: Patroni stops its PostgreSQL and exits, and so
    does etcd. Loaded beforehand, it imports nothing in the child."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, _SIGTERM)


def missing_requirements() -> list[str]:
    """What this machine lacks to run the cluster (empty when it can): Debian's ``patroni`` and
    ``etcd-server`` packages, PostgreSQL 15, and as root the ``postgres`` account."""
    missing = [tool for tool in ("patroni", "etcd") if shutil.which(tool) is None]
    if not (PG_BIN / "postgres").exists():
        missing.append(str(PG_BIN / "postgres"))
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            missing.append(f"the {SERVICE_USER} account (PostgreSQL does not run as root)")
    return missing


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (the kernel's choice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def render(template: str, values: dict[str, str]) -> str:
    """``deploy/<template>`` with its placeholders filled in (a missing one is a KeyError)."""
    return string.Template((DEPLOY / template).read_text()).substitute(values)


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    """The first truthy answer of ``check``, asked every ``POLL`` seconds for ``timeout``
    seconds; ``TimeoutError`` naming ``what`` after that."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(POLL)


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (2nd field) is in parentheses and may hold spaces: split after it.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _pids_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and not _is_gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def _kill(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path}: none)"
    return "\n".join(text[-lines:])


@dataclass
class Node:
    """One PostgreSQL node and the Patroni that runs it."""

    name: str
    dir: Path
    pg_port: int
    api_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def config(self) -> Path:
        return self.dir / "patroni.yml"

    @property
    def log(self) -> Path:
        return self.dir / "patroni.log"

    @property
    def api(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (from ``postmaster.pid``), or None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if str(self.data_dir).encode() in cmdline and not _is_gone(pid) else None


@dataclass(frozen=True)
class Failover:
    """A primary killed at ``killed_at`` (``time.monotonic()``) and the node that replaced it."""

    old: str
    new: str
    killed_at: float
    seconds: float


@dataclass
class PatroniCluster:
    """etcd plus ``size`` Patroni nodes with synchronous replication, on free 127.0.0.1 ports."""

    size: int = 2
    #: Seconds to wait for the first leader and synchronous standby.
    start_timeout: float = 120.0
    base: Path = field(init=False)
    scope: str = field(init=False)
    nodes: list[Node] = field(init=False, default_factory=list)
    superuser_password: str = field(init=False, default_factory=lambda: secrets.token_hex(12))
    _etcd: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _etcd_port: int = field(init=False, default=0)
    _run_as: dict[str, Any] = field(init=False, default_factory=dict)

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> PatroniCluster:
        try:
            self.start()
        except BaseException:
            self.dump_logs()
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.dump_logs()
        self.stop()

    def start(self) -> None:
        missing = missing_requirements()
        if missing:
            raise RuntimeError(f"cannot start a Patroni cluster: missing {', '.join(missing)}")
        self.base = Path(tempfile.mkdtemp(prefix="billing-pg-"))
        self.scope = f"billing-test-{self.base.name.removeprefix('billing-pg-')}"
        etcd_port, peer_port, *ports = free_ports(2 + 2 * self.size)
        self._etcd_port = etcd_port
        self.nodes = [
            Node(f"pg{i + 1}", self.base / f"pg{i + 1}", ports[2 * i], ports[2 * i + 1])
            for i in range(self.size)
        ]
        etcd_dir = self.base / "etcd"
        etcd_dir.mkdir()
        (etcd_dir / "etcd.yml").write_text(
            render(
                "etcd.yml.in",
                {
                    "NODE_NAME": "etcd1",
                    "NODE_HOST": HOST,
                    "CLIENT_PORT": str(etcd_port),
                    "PEER_PORT": str(peer_port),
                    "INITIAL_CLUSTER": f"etcd1=http://{HOST}:{peer_port}",
                    "CLUSTER_TOKEN": self.scope,
                    "DATA_DIR": str(etcd_dir / "data"),
                },
            )
        )
        secrets_ = {
            "SUPERUSER_PASSWORD": self.superuser_password,
            "REPLICATION_PASSWORD": secrets.token_hex(12),
            "REWIND_PASSWORD": secrets.token_hex(12),
        }
        for node in self.nodes:
            node.dir.mkdir()
            node.config.write_text(render("patroni.yml.in", self._node_values(node) | secrets_))
        self._own_directory()
        self._etcd = self._spawn(
            ["etcd", "--config-file", str(etcd_dir / "etcd.yml")], etcd_dir / "etcd.log"
        )
        wait_for("etcd answers", self._etcd_healthy, 30)
        for node in self.nodes:
            self.start_node(node.name)
        self.wait_ready(self.start_timeout)

    def stop(self) -> None:
        """Kill everything this cluster started, check that nothing is left, remove its files."""
        for node in self.nodes:
            with contextlib.suppress(TimeoutError):  # the sweep below kills what is left
                self._kill_node(node, patroni=True)
        if self._etcd is not None:
            self._etcd.kill()
            self._etcd.wait()
            self._etcd = None
        if not hasattr(self, "base"):
            return
        # Anything still running from this directory or named after this cluster (a backend
        # that outlived its postmaster, a pg_basebackup): kill it, then make sure it is gone.
        markers = (str(self.base), self.scope)
        deadline = time.monotonic() + 10
        while left := [p for m in markers for p in _pids_mentioning(m)]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of {self.base} survived SIGKILL: {left}")
            for pid in left:
                _kill(pid)
            time.sleep(POLL)
        shutil.rmtree(self.base, ignore_errors=True)

    def dump_logs(self) -> None:
        """Print the tails of etcd's, each Patroni's and each PostgreSQL's logs to stderr."""
        if not hasattr(self, "base"):
            return
        logs = [self.base / "etcd" / "etcd.log"]
        for node in self.nodes:
            logs += [node.log, *sorted((node.data_dir / "log").glob("*"))[-1:]]
        for log in logs:
            print(f"----- {log} -----\n{_tail(log)}", file=sys.stderr)

    def heal(self, timeout: float = 90.0) -> tuple[str, str]:
        """Restart every node whose Patroni is not running and wait until the cluster has a
        leader and a synchronous standby again: their names."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                self.start_node(node.name)
        return self.wait_ready(timeout)

    def start_node(self, name: str) -> None:
        """Start (or restart, after a kill) the named node's Patroni; a former primary rejoins
        as a replica, rewound with pg_rewind."""
        node = self.node(name)
        assert node.process is None or node.process.poll() is not None, f"{name} is running"
        node.process = self._spawn(["patroni", str(node.config)], node.log)

    # -- what the cluster looks like -----------------------------------------------------

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def members(self) -> list[dict[str, Any]] | None:
        """Patroni's view (``GET /cluster``) from the first node that answers, or None."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                response = httpx.get(f"{node.api}/cluster", timeout=2)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                members: list[dict[str, Any]] = response.json()["members"]
                return members
        return None

    def wait_ready(self, timeout: float = 60.0) -> tuple[str, str]:
        """Wait for a running leader and a streaming synchronous standby: their names."""

        def probe() -> tuple[str, str] | None:
            self._check_alive()
            members = self.members() or []
            leader = [
                m["name"] for m in members if m["role"] == "leader" and m["state"] == "running"
            ]
            sync = [
                m["name"]
                for m in members
                if m["role"] == "sync_standby" and m["state"] in ("running", "streaming")
            ]
            if leader and sync and self._is_primary(self.node(leader[0])):
                return leader[0], sync[0]
            return None

        return wait_for("a leader and a synchronous standby", probe, timeout)

    def primary(self) -> Node:
        """The node whose PostgreSQL is the read-write primary now (asks each node's Patroni)."""
        for node in self.nodes:
            if self._is_primary(node):
                return node
        raise LookupError("no primary")

    # -- failures -------------------------------------------------------------------------

    def kill_primary(self, *, machine: bool = True) -> tuple[str, float]:
        """SIGKILL the primary: its name and when (``time.monotonic()``).

        ``machine=True`` (the realistic case: the primary's machine dies) kills that node's
        Patroni and its PostgreSQL together; the leader lock then expires after ``ttl`` and the
        synchronous standby takes over. ``machine=False`` kills only PostgreSQL: Patroni, still
        alive, restarts it in place (crash recovery) and stays leader unless it takes longer
        than ``primary_start_timeout``.
        """
        node = self.primary()
        return node.name, self._kill_node(node, patroni=machine)

    def wait_for_primary(
        self, old: str, killed_at: float, *, other_than_old: bool = True, timeout: float = 60.0
    ) -> Failover:
        """Wait until a node is a read-write primary again after ``old`` was killed at
        ``killed_at``: another node (failover), or with ``other_than_old=False`` any node (a
        PostgreSQL restarted in place counts)."""

        def probe() -> Node | None:
            for node in self.nodes:
                if (node.name != old or not other_than_old) and self._is_primary(node):
                    return node
            return None

        new = wait_for(f"a primary after {old} was killed", probe, timeout)
        return Failover(old, new.name, killed_at, time.monotonic() - killed_at)

    # -- URLs -----------------------------------------------------------------------------

    def url(self, database: str = "postgres", node: str | None = None) -> str:
        """A SQLAlchemy URL for psycopg 3: to one node, or (``node=None``) to whichever node is
        the read-write primary, with every node listed and ``target_session_attrs=read-write``."""
        credentials = f"postgres:{self.superuser_password}"
        if node is not None:
            port = self.node(node).pg_port
            return f"postgresql+psycopg://{credentials}@{HOST}:{port}/{database}"
        hosts = "&".join(f"host={HOST}:{n.pg_port}" for n in self.nodes)
        return f"postgresql+psycopg://{credentials}@/{database}?{hosts}&{MULTI_HOST_OPTIONS}"

    def conninfo(self, node: str, database: str = "postgres") -> str:
        """A libpq connection string to one node (for psycopg without SQLAlchemy)."""
        port = self.node(node).pg_port
        return psycopg.conninfo.make_conninfo(
            host=HOST,
            port=port,
            user="postgres",
            password=self.superuser_password,
            dbname=database,
            connect_timeout=3,
        )

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` on the primary (it reaches the standby by replication)."""
        with psycopg.connect(self.conninfo(self.primary().name), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    # -- inside ---------------------------------------------------------------------------

    def _node_values(self, node: Node) -> dict[str, str]:
        return {
            "SCOPE": self.scope,
            "NODE_NAME": node.name,
            "NODE_HOST": HOST,
            "LISTEN_HOST": HOST,
            "PG_PORT": str(node.pg_port),
            "API_PORT": str(node.api_port),
            "ETCD_HOSTS": f"{HOST}:{self._etcd_port}",
            "DATA_DIR": str(node.data_dir),
            "SOCKET_DIR": str(node.dir),
            "PGPASS": str(node.dir / "pgpass"),
            "CLIENT_NETWORK": f"{HOST}/32",
            "REPLICATION_NETWORK": f"{HOST}/32",
            # Never arm a watchdog in a test: a SIGKILLed Patroni would reboot the machine.
            "WATCHDOG_MODE": "off",
        }

    def _own_directory(self) -> None:
        """As root, hand the directory to the service account and run the processes as it."""
        if os.geteuid() != 0:
            return
        account = pwd.getpwnam(SERVICE_USER)
        for path in [self.base, *self.base.rglob("*")]:
            os.chown(path, account.pw_uid, account.pw_gid)
        self._run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.base),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        with log.open("ab") as out:
            return subprocess.Popen(
                argv,
                cwd=self.base,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                **self._run_as,
            )

    def _etcd_healthy(self) -> bool | None:
        try:
            response = httpx.get(f"http://{HOST}:{self._etcd_port}/health", timeout=2)
        except httpx.HTTPError:
            return None
        return True if response.status_code == 200 else None

    def _check_alive(self) -> None:
        if self._etcd is not None and self._etcd.poll() is not None:
            raise RuntimeError(f"etcd exited with {self._etcd.returncode}")
        for node in self.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(f"patroni {node.name} exited with {node.process.returncode}")

    def _is_primary(self, node: Node) -> bool:
        """Patroni says leader (``GET /primary``: 200) and PostgreSQL is out of recovery."""
        if node.process is None or node.process.poll() is not None:
            return False
        try:
            if httpx.get(f"{node.api}/primary", timeout=2).status_code != 200:
                return False
            with psycopg.connect(self.conninfo(node.name), autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except (httpx.HTTPError, psycopg.Error):
            return False
        return row is not None and row[0] is False

    def _kill_node(self, node: Node, *, patroni: bool) -> float:
        """SIGKILL the node's PostgreSQL (postmaster and every child), and its Patroni first when
        ``patroni`` (else Patroni sees its PostgreSQL die and restarts it). Returns when the
        last SIGKILL was sent (``time.monotonic()``)."""
        if patroni and node.process is not None:
            node.process.kill()
            node.process.wait()
        postmaster = node.postmaster_pid()
        if postmaster is None:
            return time.monotonic()
        # Stopped, the postmaster cannot fork a child we would miss between listing and killing.
        _kill(postmaster, signal.SIGSTOP)
        children = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent_pid(int(p.name)) == postmaster
        ]
        # Children first: all of a machine's processes die at once, and none of them gets to
        # notice the postmaster's death and tell its client (a backend would, with FATAL 57P01).
        for pid in [*children, postmaster]:
            _kill(pid)
        killed_at = time.monotonic()
        wait_for(
            f"{node.name}'s PostgreSQL exits",
            lambda: all(_is_gone(p) for p in [postmaster, *children]),
            10,
        )
        return killed_at


def _serve() -> None:
    """Start a cluster, print its URLs, keep it up until Ctrl-C (or SIGTERM)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with PatroniCluster() as cluster:
        leader, standby = cluster.wait_ready()
        print(f"cluster {cluster.scope} in {cluster.base}")
        print(f"leader {leader}, synchronous standby {standby}")
        for node in cluster.nodes:
            print(f"  {node.name}: {cluster.url(node=node.name)}  (Patroni: {node.api})")
        print(f"multi-host: {cluster.url()}")
        print(f"patronictl -c {cluster.nodes[0].config} list")
        print("Ctrl-C stops it and removes everything.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    _serve()
