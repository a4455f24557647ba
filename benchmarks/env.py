"""The benchmark's environment: servers, tidemq processes, and what they cost (CPU, memory).

MariaDB and ZooKeeper are the same throwaway servers the integration tests use
(``tests/servers.py``); brokers and workers are real ``tidemq`` processes.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

from tests.galera import GaleraCluster
from tests.servers import MariaDB, ZooKeeper, wait_until

__all__ = ["Cluster", "CpuMeter", "Proc", "cpu_seconds", "rss_mb", "tree_rss_mb", "machine", "run_threads", "stop_all",
           "descendants", "exited", "stop_descendants", "wait_until"]

TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError):
        return 0.0


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # gone while we looked
    return kids


def descendants(pid: int) -> list[int]:
    """Every process started by ``pid``, and by those, that is still in the process table."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found.extend(kids)
        todo.extend(kids)
    return found


def exited(pid: int) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie not reaped yet)."""
    # A zombie has exited; its parent (or init, slowly) has yet to reap it.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stop_descendants(grace: float = 10.0) -> list[int]:
    """SIGTERM every process this one started (and theirs) that is still running, SIGKILL what
    is left after ``grace`` seconds; returns their pids. The last step of a run, so nothing it
    started outlives it, whatever a scenario's own cleanup missed."""
    pids = [p for p in descendants(os.getpid()) if not exited(p)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not all(exited(p) for p in pids):
        for pid in pids:  # reap our own children as they go, so they do not linger as zombies
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        time.sleep(0.05)
    for pid in pids:
        if not exited(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return pids


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants in MiB: a pre-forking worker's memory is mostly
    in its children (Celery's prefork pool, RQ's scheduler)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += rss_mb(p)
        except OSError:
            continue
        todo.extend(_children(p))
    return total


def machine() -> dict:
    """Cores, memory, versions: what the figures were measured on."""
    import grpc
    import pymysql
    import sqlalchemy

    with open("/proc/meminfo") as fh:
        mem_kb = int(fh.readline().split()[1])
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    mariadb = subprocess.run(["mariadbd", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "cores": os.cpu_count(), "cpu": model, "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(), "os": platform.platform(),
        "mariadb": mariadb.split(" Ver ")[-1].split(" for ")[0] if mariadb else "",
        "grpcio": grpc.__version__, "pymysql": pymysql.__version__, "sqlalchemy": sqlalchemy.__version__,
    }


def run_threads(total: int, threads: int, send: Callable[[int], None], progress: Callable[[int], None]) -> float:
    """Run ``send(i)`` for every i < total, split over ``threads`` threads; return calls per second."""
    done = [0] * threads
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for i in range(k, total, threads):
                send(i)
                done[k] += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        while w.is_alive():
            progress(sum(done))
            w.join(0.25)
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return total / elapsed


def stop_all(procs: "list[Proc]", timeout: float = 15.0) -> None:
    """SIGTERM every process at once (they shut down in parallel), then wait for each."""
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.stop(timeout)


class Proc:
    """A child process of the benchmark with its log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: str) -> None:
        self.name = name
        #: Where its Prometheus endpoint listens (TIDEMQ_METRICS_PORT), 0 for none.
        self.metrics_port = int(env.get("TIDEMQ_METRICS_PORT", "") or 0)
        self.log_path = os.path.join(logdir, f"{name}.log")
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, cwd=os.getcwd())

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            with open(self.log_path, errors="replace") as fh:
                tail = fh.read()[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; log tail:\n{tail}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (workers drain), then SIGKILL if it does not leave in time."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


class Cluster:
    """MariaDB + ZooKeeper + any number of brokers and workers, all started here."""

    def __init__(self, zk_root: str = "/bench", mariadb_options: tuple[str, ...] = (), galera: bool = False) -> None:
        self.dir = tempfile.mkdtemp(prefix="tidemq-bench-")
        # --galera: a 3-node Galera cluster instead of one server; brokers get every node's
        # address and write through the first, and the raw baseline writes through it too.
        self.galera = GaleraCluster(3).start() if galera else None
        self.mariadb = self.galera.nodes[0] if self.galera else MariaDB(*mariadb_options).start()
        self.zookeeper = ZooKeeper().start()
        self.db_url = (self.galera or self.mariadb).create_database("tidemq_bench")
        self.zk_root = zk_root
        self.brokers: list[Proc] = []
        self.workers: list[Proc] = []
        self._zk = None  # the benchmark's own ZooKeeper session, to see workers register
        self._started: dict[str, int] = {}  # the number of the last broker / worker started
        from tidemq_broker.storages import open_storage

        storage = open_storage(self.db_url)
        storage.schema.create_schema()
        storage.close()

    @property
    def settings_env(self) -> dict[str, str]:
        return {"TIDEMQ_DB_URL": self.db_url, "TIDEMQ_ZK_HOSTS": self.zookeeper.hosts,
                "TIDEMQ_ZK_ROOT": self.zk_root, "TIDEMQ_BROKERS": ""}

    def client(self, direct: bool = False, path: str = ""):
        """A tidemq Client of this cluster (discovers brokers through ZooKeeper); ``direct``: one
        that commits what it produces itself (``TIDEMQ_PRODUCE=direct``); ``path``: another
        ``TIDEMQ_PRODUCE`` (``unary``: a Produce call per request instead of streams)."""
        from tidemq import Client, Settings

        path = "direct" if direct else path
        env = {**self.settings_env, "TIDEMQ_PRODUCE": path} if path else self.settings_env
        return Client(Settings.from_env(env=env))

    def start_broker(self, extra_env: Optional[dict[str, str]] = None) -> Proc:
        # Numbered by every broker started, not by those running: a broker started after another
        # was stopped must not read the stopped one's port file.
        n = self._started["broker"] = self._started.get("broker", -1) + 1
        port_file = os.path.join(self.dir, f"broker-{n}.port")
        proc = Proc(f"broker-{n}", TIDEMQ + ["broker", "--port", "0", "--port-file", port_file],
                    {**self.settings_env, **(extra_env or {})}, self.dir)

        def ready() -> bool:
            proc.check_alive()
            return os.path.exists(port_file)

        wait_until(ready, 60, 0.05, f"broker {n}")
        with open(port_file) as fh:
            proc.address = f"127.0.0.1:{fh.read().strip()}"  # type: ignore[attr-defined]
        self.brokers.append(proc)
        return proc

    def start_workers(self, count: int, topic: str, env: dict[str, str],
                      module: str = "benchmarks.consumers") -> list[Proc]:
        """``count`` worker processes running ``module`` (benchmarks.consumers by default) on
        ``topic``; waits until all are registered in ZooKeeper, so a measurement never includes
        their start-up."""
        procs = []
        for i in range(count):
            n = self._started["worker"] = self._started.get("worker", -1) + 1
            proc = Proc(f"worker-{n}", TIDEMQ + ["worker", module],
                        {**self.settings_env, "BENCH_TOPIC": topic, **env}, self.dir)
            self.workers.append(proc)
            procs.append(proc)
        wait_until(lambda: self._registered(topic, procs) >= count, 60, 0.05, f"{count} workers on {topic}")
        return procs

    def _registered(self, topic: str, procs: list[Proc]) -> int:
        for proc in procs:
            proc.check_alive()
        if self._zk is None:
            from kazoo.client import KazooClient

            self._zk = KazooClient(hosts=self.zookeeper.hosts)
            self._zk.start(10)
        path = f"{self.zk_root}/consumers/{topic}"
        return len(self._zk.get_children(path)) if self._zk.exists(path) else 0

    def stop_workers(self) -> None:
        for proc in self.workers:
            proc.stop()
        self.workers = []

    def stop_brokers(self) -> None:
        for proc in self.brokers:
            proc.stop()
        self.brokers = []

    def cleanup(self, keep_logs: bool = False) -> None:
        """Stop every process this cluster started, then its servers, and remove their files:
        the servers' data, and the directory of the brokers' and workers' logs unless
        ``keep_logs`` (a run that failed keeps them: they say why)."""
        self.stop_workers()
        self.stop_brokers()
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
        self.zookeeper.cleanup()
        (self.galera or self.mariadb).cleanup()
        if not keep_logs:
            shutil.rmtree(self.dir, ignore_errors=True)


class CpuMeter:
    """CPU seconds each named process used between ``start()`` and ``stop()``: where time went."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self._before: dict[str, float] = {}
        self._began = 0.0
        self.seconds: dict[str, float] = {}
        self.wall = 0.0

    def _sample(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.pids.items()}

    def __enter__(self) -> "CpuMeter":
        self._before = self._sample()
        self._began = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self._began
        after = self._sample()
        self.seconds = {k: round(after[k] - self._before[k], 2) for k in after}

    def shares(self) -> dict[str, float]:
        """CPU seconds per wall second of each process group (1.0 = one core busy)."""
        return {k: round(v / self.wall, 2) if self.wall else 0.0 for k, v in self.seconds.items()}
