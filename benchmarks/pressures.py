"""The pressures of a shared production database, one class each: ``start()`` begins it,
``stop()`` ends it, ``fault_end`` is when it really ended (a restarted server: when it answered
again), ``counts`` what it did (kills, scans, connections held ...).

Every pressure runs on threads of its own (or a child process: the dump) and stops within
seconds of ``stop()``; ``abort()`` stops it without restarting anything, for a run that is
being torn down.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
import time
from argparse import Namespace
from typing import Any, Callable, Optional

import pymysql

from .pressure_env import APP_USER, DATABASE, HOG_USER, PressureCluster, connect

__all__ = ["KINDS", "CATEGORY", "Pressure", "make"]

#: kind -> what it does (the report's and the docs' wording).
KINDS = {
    "idle-view": "an idle REPEATABLE READ transaction holds a read view (consistent snapshot + one SELECT)",
    "idle-view-10m": "the same read view held for --idle-long-seconds (10 min)",
    "rr-readers": "REPEATABLE READ readers scanning the message table in a loop",
    "dump": "mariadb-dump --single-transaction of the database in a loop",
    "kill-connections": "KILL CONNECTION of one of tidemq's connections, 10 times a second",
    "mariadb-stop": "MariaDB stopped (SIGTERM) for --outage-seconds, then started again",
    "max-connections": "other clients take every free connection up to max_connections and hold them",
    "zookeeper-stop": "ZooKeeper stopped for --outage-seconds (> the session timeout), then started",
    "worker-kill": "a worker killed with kill -9 every --kill-every seconds, restarted at once",
    "broker-kill": "a broker killed with kill -9 every --kill-every seconds, restarted at once",
    "overload": "offered --overload x capacity, then back to the base rate",
}
#: kind -> which targets apply: read views, server faults, worker kills, overload.
CATEGORY = {"idle-view": "read-view", "idle-view-10m": "read-view", "rr-readers": "read-view", "dump": "read-view",
            "kill-connections": "server", "mariadb-stop": "server", "max-connections": "server",
            "zookeeper-stop": "server", "broker-kill": "server", "worker-kill": "worker", "overload": "overload"}


class Pressure:
    """Base: a pressure with a stop event, its threads, and what it counted."""

    def __init__(self) -> None:
        self.fault_end: Optional[float] = None
        self.counts: dict[str, Any] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=f"bench-{type(self).__name__}", daemon=True)
        self._threads.append(t)
        t.start()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        deadline = time.time() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.time()))
        if self.fault_end is None:
            self.fault_end = time.time()

    def abort(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


class IdleView(Pressure):
    """A REPEATABLE READ transaction that read once and then waits: InnoDB keeps its read view,
    so purge stops. (Under the server's READ COMMITTED a read view lives only as long as each
    statement: the session asks for REPEATABLE READ, as a dump or a report tool does.)"""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self._conn: Optional[pymysql.connections.Connection] = None

    def start(self) -> None:
        self._conn = connect(self.port)
        with self._conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SELECT COUNT(*) FROM tidemq_message")
            self.counts["rows seen"] = int(cur.fetchone()[0])

    def stop(self, timeout: float = 120.0) -> None:
        if self._conn is not None:
            self._conn.commit()
            self._conn.close()
            self._conn = None
        super().stop(timeout)

    def abort(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Readers(Pressure):
    """``n`` REPEATABLE READ sessions, each scanning the whole message table in a transaction,
    again and again (an analytics job)."""

    SCAN = "SELECT status, COUNT(*), SUM(LENGTH(data)), MAX(add_time) FROM tidemq_message GROUP BY status"

    def __init__(self, port: int, n: int) -> None:
        super().__init__()
        self.port, self.n = port, n
        self.counts = {"scans": 0}
        self._ids: list[int] = []

    def start(self) -> None:
        for _ in range(self.n):
            conn = connect(self.port, read_timeout=300)
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self._ids.append(conn.thread_id())
            self._spawn(self._scan, conn)

    def _scan(self, conn: pymysql.connections.Connection) -> None:
        try:
            with conn.cursor() as cur:
                while not self._stop.is_set():
                    cur.execute("START TRANSACTION")
                    cur.execute(self.SCAN)
                    cur.fetchall()
                    cur.execute("COMMIT")
                    self.counts["scans"] += 1
        except pymysql.err.MySQLError:
            pass  # killed by stop() in the middle of a scan
        finally:
            conn.close()

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self.fault_end = time.time()
        _kill_threads(self.port, self._ids)  # a scan in progress ends now, not when it is done
        super().stop(timeout)

    def abort(self) -> None:
        self.stop(10)


class Dump(Pressure):
    """``mariadb-dump --single-transaction`` of the database, one after another."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.counts = {"dumps": 0, "failed": 0, "seconds": []}
        self._proc: Optional[subprocess.Popen] = None
        self._binary = shutil.which("mariadb-dump") or shutil.which("mysqldump")
        if not self._binary:
            raise RuntimeError("mariadb-dump (or mysqldump) not found: it comes with mariadb-client")

    def start(self) -> None:
        self._spawn(self._loop)

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.time()
            self._proc = subprocess.Popen(
                [self._binary, "--no-defaults", "--single-transaction", "--quick", "-h127.0.0.1", f"-P{self.port}",
                 "-uroot", DATABASE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            code = self._proc.wait()
            if self._stop.is_set():
                return
            self.counts["dumps" if code == 0 else "failed"] += 1
            self.counts["seconds"].append(round(time.time() - began, 1))

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self.fault_end = time.time()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        super().stop(timeout)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        secs = self.counts.pop("seconds")
        self.counts["mean seconds"] = round(sum(secs) / len(secs), 1) if secs else None

    def abort(self) -> None:
        self.stop(10)


class ConnectionKiller(Pressure):
    """``KILL CONNECTION`` of one connection of tidemq's user, ``per_second`` times a second."""

    def __init__(self, port: int, per_second: float) -> None:
        super().__init__()
        self.port, self.period = port, 1 / per_second
        self.counts = {"killed": 0}

    def start(self) -> None:
        self._spawn(self._loop)

    def _loop(self) -> None:
        conn, rng, due = None, random.Random(26), time.time()
        while not self._stop.wait(max(0.0, due - time.time())):
            due += self.period
            try:
                conn = conn or connect(self.port, database=None)
                with conn.cursor() as cur:
                    cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (APP_USER,))
                    ids = [r[0] for r in cur.fetchall()]
                    if ids:
                        cur.execute(f"KILL CONNECTION {int(rng.choice(ids))}")
                        self.counts["killed"] += 1
            except pymysql.err.MySQLError:
                pass  # the connection ended on its own meanwhile (1094), or the server is busy
        if conn is not None:
            conn.close()


class ConnectionHog(Pressure):
    """Other clients open connections until MariaDB refuses them, hold them, and take any that
    frees up."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.counts = {"held": 0, "seconds to fill": None}
        self._conns: list[pymysql.connections.Connection] = []

    def start(self) -> None:
        self._spawn(self._loop)

    def _loop(self) -> None:
        began = time.time()
        while not self._stop.is_set():
            try:
                self._conns.append(connect(self.port, user=HOG_USER, database=None, timeout=2))
                self.counts["held"] = max(self.counts["held"], len(self._conns))
            except pymysql.err.MySQLError:
                if self.counts["seconds to fill"] is None:
                    self.counts["seconds to fill"] = round(time.time() - began, 1)
                self._stop.wait(0.2)
        for c in self._conns:
            c.close()

    def abort(self) -> None:
        self.stop(10)


class Outage(Pressure):
    """A server (MariaDB or ZooKeeper, tests/servers.py) stopped for ``seconds``, then started
    on the same data and port; ``fault_end`` is when it serves again."""

    def __init__(self, server: Any, seconds: float) -> None:
        super().__init__()
        self.server, self.seconds = server, seconds
        self._abort = threading.Event()

    def start(self) -> None:
        self._spawn(self._run)

    def _run(self) -> None:
        began = time.time()
        self.server.stop()
        self.counts["seconds to stop"] = round(time.time() - began, 1)
        if self._abort.wait(max(0.0, began + self.seconds - time.time())):
            return
        self.server.start()
        self.fault_end = time.time()
        self.counts["down seconds"] = round(self.fault_end - began, 1)

    def stop(self, timeout: float = 120.0) -> None:
        # The outage lasts its seconds even when the stress phase is shorter.
        for t in self._threads:
            t.join(timeout)
        super().stop(timeout)

    def abort(self) -> None:
        self._abort.set()
        super().abort()


class ProcessKiller(Pressure):
    """``kill -9`` of the longest-running broker or worker every ``every`` seconds, the first at
    once; a replacement starts right after each kill."""

    def __init__(self, cluster: PressureCluster, which: str, every: float) -> None:
        super().__init__()
        self.cluster, self.which, self.every = cluster, which, every
        self.counts = {"killed": 0}

    def start(self) -> None:
        self._spawn(self._loop)

    def _loop(self) -> None:
        due = time.time()
        while not self._stop.wait(max(0.0, due - time.time())):
            due += self.every
            group = self.cluster.workers if self.which == "worker" else self.cluster.brokers
            if not group:
                continue
            self.cluster.kill(group[0])
            self.counts["killed"] += 1
            if self._stop.is_set():
                return
            if self.which == "worker":
                self.cluster.start_worker()
            else:
                self.cluster.start_broker()


class Overload(Pressure):
    """The producer's rate raised to ``rate`` while it lasts."""

    def __init__(self, producer: Any, rate: float) -> None:
        super().__init__()
        self.producer, self.rate = producer, rate
        self._base = producer.rate

    def start(self) -> None:
        self.producer.rate = self.rate
        self.counts["offered"] = round(self.rate)

    def stop(self, timeout: float = 120.0) -> None:
        self.producer.rate = self._base
        super().stop(timeout)


def _kill_threads(port: int, ids: list[int]) -> None:
    """KILL the given server threads (ending their statements) from a connection of our own."""
    try:
        conn = connect(port, database=None)
    except pymysql.err.MySQLError:
        return
    try:
        with conn.cursor() as cur:
            for i in ids:
                try:
                    cur.execute(f"KILL CONNECTION {int(i)}")
                except pymysql.err.MySQLError:
                    pass  # already gone
    finally:
        conn.close()


def make(kind: str, cluster: PressureCluster, producer: Any, capacity: float, args: Namespace) -> Pressure:
    """The pressure of ``kind`` on ``cluster`` (``producer`` and ``capacity`` for overload)."""
    port = cluster.port
    if kind in ("idle-view", "idle-view-10m"):
        return IdleView(port)
    if kind == "rr-readers":
        return Readers(port, args.readers)
    if kind == "dump":
        return Dump(port)
    if kind == "kill-connections":
        return ConnectionKiller(port, args.kills_per_second)
    if kind == "max-connections":
        return ConnectionHog(port)
    if kind == "mariadb-stop":
        return Outage(cluster.mariadb, args.outage_seconds)
    if kind == "zookeeper-stop":
        return Outage(cluster.zookeeper, args.outage_seconds)
    if kind in ("worker-kill", "broker-kill"):
        return ProcessKiller(cluster, kind.split("-")[0], args.kill_every)
    if kind == "overload":
        return Overload(producer, args.overload * capacity)
    raise ValueError(f"unknown pressure {kind!r}: expected one of {', '.join(KINDS)}")
