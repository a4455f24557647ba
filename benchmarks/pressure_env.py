"""The pressure scenario's cluster: fresh servers, tidemq under its own database user, and the
benchmark's own connections beside it.

tidemq's brokers connect as the user ``tidemq`` (all privileges on its database, none global),
so the connection killer can tell tidemq's connections from everyone else's and the
connection hog's user (``hog``, no privileges at all) is refused like any application once
``max_connections`` is reached. The benchmark itself connects as root: MariaDB keeps one
connection beyond ``max_connections`` for such a user, and the benchmark opens its own before
any pressure starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
import time
from typing import Iterator, Optional

import pymysql

from .env import TIDEMQ, Cluster, Proc, wait_until

__all__ = ["PressureCluster", "HistorySampler", "connect", "add_users", "logs_to_file", "APP_USER", "APP_PASSWORD",
           "HOG_USER", "DATABASE"]

APP_USER, APP_PASSWORD = "tidemq", "tidemq-bench"
HOG_USER = "hog"
DATABASE = "tidemq_bench"


def connect(port: int, user: str = "root", database: Optional[str] = DATABASE, timeout: float = 3,
            **options) -> pymysql.connections.Connection:
    """A PyMySQL connection without TLS: PyMySQL's default ("preferred") builds a TLS context
    per connection, tens of ms of CPU, which a loop opening connections would spend on itself."""
    return pymysql.connect(host="127.0.0.1", port=port, user=user, database=database, connect_timeout=timeout,
                           autocommit=True, ssl_disabled=True, **options)


def add_users(server) -> None:
    """tidemq's user (its database only) and the hog's (no privileges) on ``server``
    (a tests/servers.py MariaDB)."""
    for sql in (f"CREATE USER '{APP_USER}'@'127.0.0.1' IDENTIFIED BY '{APP_PASSWORD}'",
                f"GRANT ALL ON `{DATABASE}`.* TO '{APP_USER}'@'127.0.0.1'",
                f"CREATE USER '{HOG_USER}'@'127.0.0.1'"):
        server.execute(sql)


class PressureCluster(Cluster):
    """A fresh MariaDB + ZooKeeper, ``brokers`` brokers and ``workers`` workers on ``topic``."""

    def __init__(self, mariadb_options: tuple[str, ...], topic: str, worker_env: dict[str, str]) -> None:
        super().__init__(zk_root="/pressure", mariadb_options=mariadb_options)
        self.topic = topic
        self.worker_env = worker_env
        self.process_env: dict[str, str] = {}  # for brokers and workers alike (benchmarks.gc_pauses)
        self.killed: dict[int, float] = {}  # pid -> when the benchmark killed it (epoch s)
        try:
            add_users(self.mariadb)
        except BaseException:
            self.cleanup(keep_logs=True)
            raise
        self.root_url = self.db_url
        self.db_url = f"mysql+pymysql://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.mariadb.port

    def start_worker(self) -> Proc:
        """One more worker process; does not wait for it to register (a restart's cost is part
        of what is measured)."""
        with self._lock:
            n = self._started["worker"] = self._started.get("worker", -1) + 1
            proc = Proc(f"worker-{n}", TIDEMQ + ["worker", "benchmarks.consumers"],
                        {**self.settings_env, "BENCH_TOPIC": self.topic, **self.process_env, **self.worker_env},
                        self.dir)
            self.workers.append(proc)
        return proc

    def start_broker(self, extra_env: Optional[dict[str, str]] = None) -> Proc:
        return super().start_broker({**self.process_env, **(extra_env or {})})

    def start_all(self, brokers: int, workers: int) -> None:
        for _ in range(brokers):
            self.start_broker()
        procs = [self.start_worker() for _ in range(workers)]
        wait_until(lambda: self._registered(self.topic, procs) >= workers, 120, 0.05, f"{workers} workers")

    def kill(self, proc: Proc) -> None:
        """``kill -9`` a broker or worker and note when it was gone."""
        proc.popen.kill()
        proc.popen.wait(30)
        # Stamped once it is dead, not when the signal left: a handler it started in between
        # was still its own, and running that message again is the killed holder's duplicate.
        self.killed[proc.pid] = time.time()
        with self._lock:
            for group in (self.brokers, self.workers):
                if proc in group:
                    group.remove(proc)

    def stop_stack(self, grace: float) -> dict[str, object]:
        """SIGTERM every broker and worker at once (a whole stack stopped together); returns how
        many seconds each took to exit, or "killed" for those SIGKILLed after ``grace``."""
        procs = [p for p in self.brokers + self.workers if p.popen.poll() is None]
        began = time.time()
        for p in procs:
            p.popen.send_signal(signal.SIGTERM)
        took: dict[str, object] = {}
        while len(took) < len(procs):
            for p in procs:
                if p.name not in took and p.popen.poll() is not None:
                    took[p.name] = round(time.time() - began, 1)
            if time.time() - began > grace:
                for p in procs:
                    if p.name not in took:
                        p.popen.kill()
                        p.popen.wait(10)
                        took[p.name] = "killed"
            time.sleep(0.05)
        self.brokers, self.workers = [], []
        return took

    def exited(self) -> list[str]:
        """Brokers, workers and servers that ended although the benchmark did not stop them."""
        gone = [f"{p.name} (exit {p.popen.returncode})" for p in self.brokers + self.workers
                if p.popen.poll() is not None]
        for name, server in (("mariadb", self.mariadb), ("zookeeper", self.zookeeper)):
            if server.proc is not None and server.proc.poll() is not None:
                gone.append(f"{name} (exit {server.proc.returncode})")
        return gone

    def cleanup(self, keep_logs: bool = False) -> None:
        """Everything stopped and removed; with ``keep_logs`` the servers' own logs are kept
        beside the brokers' and workers' (a server that crashed under a pressure is a finding)."""
        try:
            self.stop_workers()
            self.stop_brokers()
            self.mariadb.stop()
            self.zookeeper.stop()
            for source, name in ((os.path.join(self.mariadb.dir, "error.log"), "mariadb-error.txt"),
                                 (os.path.join(self.zookeeper.dir, "zk.log"), "zookeeper.txt")):
                if keep_logs and os.path.exists(source):
                    shutil.copyfile(source, os.path.join(self.dir, name))
        finally:
            super().cleanup(keep_logs)

    def log_lines(self) -> int:
        """Lines the brokers' and workers' logs hold so far, restarted processes included."""
        total = 0
        for name in os.listdir(self.dir):
            if name.startswith(("broker-", "worker-")) and name.endswith(".log"):
                with open(os.path.join(self.dir, name), "rb") as fh:
                    total += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        return total


@contextlib.contextmanager
def logs_to_file(path: str) -> Iterator[None]:
    """This process's kazoo and tidemq log lines go to ``path`` while the block runs: the
    benchmark's own clients lose ZooKeeper or a broker under some pressures on purpose, and
    their warnings would otherwise interleave with the table on stderr."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(name) for name in ("kazoo", "tidemq")]
    before = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, propagate in zip(loggers, before):
            lg.removeHandler(handler)
            lg.propagate = propagate
        handler.close()


class HistorySampler:
    """InnoDB's history list length once a second (``trx_rseg_history_len``): how much undo
    purge is behind, the cost a long read view leaves in every index the queue walks. A sample
    the server cannot answer (it is down) is None."""

    QUERY = "SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'"

    def __init__(self, port: int, interval: float = 1.0) -> None:
        self.port, self.interval = port, interval
        self.samples: list[tuple[float, Optional[int]]] = []
        self._conn: Optional[pymysql.connections.Connection] = connect(port, database=None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-history", daemon=True)

    def start(self) -> "HistorySampler":
        self._thread.start()
        return self

    def _read(self) -> Optional[int]:
        try:
            if self._conn is None:
                self._conn = connect(self.port, database=None, timeout=1)
            with self._conn.cursor() as cur:
                cur.execute(self.QUERY)
                return int(cur.fetchone()[0])
        except pymysql.err.MySQLError:
            self._close()
            return None

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._read()))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._close()
