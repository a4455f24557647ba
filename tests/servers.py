"""Real MariaDB, ZooKeeper and Prometheus servers from Debian's packages, started by the tests themselves.

Each server runs in a temporary directory on a free loopback port. ``kill()`` sends SIGKILL and
``restart()`` starts the same data directory on the same port, for the fault tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

from tests.failure_context import ReportedServer

__all__ = ["free_port", "MariaDB", "Prometheus", "ZooKeeper", "ZooKeeperEnsemble", "wait_until"]

ZK_CLASSPATH = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: InnoDB refills ``information_schema.INNODB_TRX`` only when nobody read it in the last 0.1 s:
#: a faster poll keeps reading the table as it was when the polling began. Poll it this slowly.
INNODB_TRX_POLL = 0.25
#: How many transactions wait for a row lock now (poll it every ``INNODB_TRX_POLL``).
LOCK_WAITS = "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"


def wait_until(predicate, timeout: float, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def _reap(proc: Optional[subprocess.Popen], sig: int, timeout: float = 30) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class MariaDB(ReportedServer):
    """A throwaway MariaDB server (user root@127.0.0.1, no password)."""

    kind = "MariaDB"
    log_name = "error.log"
    user = "root"  # the operating-system user mariadbd runs as

    def __init__(self, *options: str, install: bool = True, directory: Optional[str] = None) -> None:
        self.options = options  # extra server options, e.g. "--innodb-autoinc-lock-mode=2"
        self.dir = directory or tempfile.mkdtemp(prefix="tidemq-mariadb-")
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        if install:
            subprocess.run(
                ["mariadb-install-db", "--no-defaults", f"--datadir={self.dir}/data", f"--user={self.user}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )

    def arguments(self) -> list[str]:
        """The server's command line."""
        return [
            "mariadbd", "--no-defaults", f"--user={self.user}", f"--datadir={self.dir}/data",
            f"--socket={self.dir}/mysql.sock", f"--pid-file={self.dir}/mariadb.pid", f"--port={self.port}",
            "--bind-address=127.0.0.1", "--skip-name-resolve", f"--log-error={self.dir}/error.log",
            "--skip-log-bin", "--innodb-buffer-pool-size=256M", "--character-set-server=utf8mb4",
            "--transaction-isolation=READ-COMMITTED", "--max-connections=1000",
            "--innodb-flush-log-at-trx-commit=1", "--max-allowed-packet=64M", *self.options]

    def start(self, timeout: float = 60, wait: bool = True) -> "MariaDB":
        self._touch()
        log = open(os.path.join(self.dir, "stdout.log"), "ab")
        self.proc = subprocess.Popen(self.arguments(), stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(self._ready, timeout, 0.05, f"MariaDB on port {self.port} (log: {self.dir}/error.log)")

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"mariadbd exited with {self.proc.returncode}; see {self.dir}/error.log")
        import pymysql

        try:
            conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=1)
        except pymysql.err.OperationalError:
            return False
        try:
            return self._serving(conn)
        finally:
            conn.close()

    def _serving(self, conn) -> bool:
        return True

    def url(self, database: str) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: Optional[str] = None) -> list[tuple]:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", database=database, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        self.execute(f"DROP DATABASE IF EXISTS `{name}`")
        self.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return self.url(name)

    def kill(self) -> None:
        """SIGKILL the server (a crash)."""
        self._touch()
        _reap(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        self._touch()
        _reap(self.proc, signal.SIGTERM)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        self._remove()


def _four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeper(ReportedServer):
    """One ZooKeeper server (standalone, or one member of an ensemble)."""

    kind = "ZooKeeper"
    log_name = "zk.log"

    def __init__(self, port: Optional[int] = None, ensemble: str = "", myid: int = 0,
                 directory: Optional[str] = None) -> None:
        self.dir = directory or tempfile.mkdtemp(prefix="tidemq-zk-")
        self.port = port or free_port()
        self.proc: Optional[subprocess.Popen] = None
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        if myid:
            with open(os.path.join(self.dir, "data", "myid"), "w") as fh:
                fh.write(str(myid))
        with open(os.path.join(self.dir, "zoo.cfg"), "w") as fh:
            fh.write(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\n"
                f"dataDir={self.dir}/data\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                "maxClientCnxns=0\n4lw.commands.whitelist=*\nadmin.enableServer=false\n"
                "minSessionTimeout=1000\nmaxSessionTimeout=60000\n" + ensemble
            )

    def start(self, timeout: float = 60, wait: bool = True) -> "ZooKeeper":
        self._touch()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true", "-cp", ZK_CLASSPATH,
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", os.path.join(self.dir, "zoo.cfg")],
            stdout=log, stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def mode(self) -> str:
        for line in _four_letter(self.port, "srvr").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}; see {self.dir}/zk.log")
            return bool(self.mode())

        wait_until(ready, timeout, 0.05, f"ZooKeeper on port {self.port} (log: {self.dir}/zk.log)")

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        self._touch()
        _reap(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        self._touch()
        _reap(self.proc, signal.SIGTERM)

    def cleanup(self) -> None:
        self.stop()
        self._remove()


class ZooKeeperEnsemble:
    """Three ZooKeeper servers on this machine forming one ensemble."""

    def __init__(self, size: int = 3) -> None:
        ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
        servers = "".join(f"server.{i + 1}=127.0.0.1:{q}:{e}\n" for i, (_, q, e) in enumerate(ports))
        self.members = [ZooKeeper(port=c, ensemble=servers, myid=i + 1) for i, (c, _, _) in enumerate(ports)]

    def start(self, timeout: float = 60) -> "ZooKeeperEnsemble":
        for member in self.members:
            member.start(wait=False)
        for member in self.members:
            member.wait_ready(timeout)
        return self

    @property
    def hosts(self) -> str:
        return ",".join(m.hosts for m in self.members)

    def leader(self) -> ZooKeeper:
        return wait_until(lambda: next((m for m in self.members if m.mode() == "leader"), None), 30,
                          what="a ZooKeeper leader")

    def cleanup(self) -> None:
        for member in self.members:
            member.cleanup()


class Prometheus(ReportedServer):
    """A Prometheus server scraping every second; tests add targets with ``scrape``.

    Targets live in a file-based service discovery file that Prometheus re-reads on change, so
    one server serves the whole session and each test names its own processes (its ``job``
    label) without a restart.
    """

    kind = "Prometheus"
    log_name = "prometheus.log"

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tidemq-prometheus-")
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self._targets: dict[str, list[str]] = {}
        self._write_targets()
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as fh:
            fh.write(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: tidemq\n    file_sd_configs:\n"
                f"      - files: ['{self.dir}/targets.json']\n        refresh_interval: 1s\n")

    def start(self, timeout: float = 60) -> "Prometheus":
        self._touch()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.dir}/prometheus.yml", f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._ready, timeout, 0.05, f"Prometheus on port {self.port} (log: {self.dir}/prometheus.log)")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.dir}/prometheus.log")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_targets(self) -> None:
        groups = [{"targets": targets, "labels": {"test": job}} for job, targets in self._targets.items()]
        path = os.path.join(self.dir, "targets.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(groups, fh)
        os.replace(path + ".tmp", path)  # Prometheus never reads half a file

    def scrape(self, job: str, *targets: str) -> None:
        """Scrape ``targets`` (host:port) from now on, labelled ``test=<job>``."""
        self._targets[job] = list(targets)
        self._write_targets()

    def forget(self, job: str) -> None:
        self._targets.pop(job, None)
        self._write_targets()

    def active_targets(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/targets")["activeTargets"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (each item has ``metric`` and ``value``)."""
        return self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))["result"]

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {body}")
        return body["data"]

    def cleanup(self) -> None:
        _reap(self.proc, signal.SIGKILL)
        self._remove()
