"""Every pressure of the pressure scenario really does what it says, and stops when told,
against real servers of its own (the smoke run takes only one kind end to end).

One MariaDB (max_connections 40, so the hog fills it quickly) and one ZooKeeper serve this
module; the outage tests stop and start them.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pymysql
import pytest

from benchmarks import raw
from benchmarks.env import Proc, exited
from benchmarks.pressure_env import APP_PASSWORD, APP_USER, DATABASE, PressureCluster, add_users, connect
from benchmarks.pressures import (ConnectionHog, ConnectionKiller, Dump, IdleView, Outage, Overload, ProcessKiller,
                                  Readers, make, KINDS)
from tests.servers import INNODB_TRX_POLL, MariaDB, ZooKeeper, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    db = MariaDB("--max-connections=40").start()
    try:
        url = db.create_database(DATABASE)
        from tidemq_broker.storages import open_storage

        storage = open_storage(url)
        storage.schema.create_schema()
        storage.close()
        add_users(db)
        raw.load(url, "bench.pressure", 2000, lambda i: raw.clock.now())
        yield db
    finally:
        db.cleanup()


def _app(port: int) -> pymysql.connections.Connection:
    return connect(port, user=APP_USER, password=APP_PASSWORD)


def _alive(conn: pymysql.connections.Connection) -> bool:
    try:
        conn.ping(reconnect=False)
        return True
    except pymysql.err.Error:
        return False


def test_the_idle_view_holds_back_purge_until_stopped(server):
    def open_transactions() -> list[tuple]:
        return server.execute("SELECT trx_isolation_level FROM information_schema.INNODB_TRX")

    def history() -> int:
        return server.execute("SELECT COUNT FROM information_schema.INNODB_METRICS "
                              "WHERE NAME = 'trx_rseg_history_len'")[0][0]

    pressure = IdleView(server.port)
    pressure.start()
    assert pressure.counts["rows seen"] == 2000
    assert open_transactions() == [("REPEATABLE READ",)]
    writer = connect(server.port)
    with writer.cursor() as cur:
        for i in range(200):  # 200 transactions, each leaving undo that purge may not remove
            cur.execute("UPDATE tidemq_message SET version = version + 1 WHERE id = %s", (i + 1,))
    writer.close()
    time.sleep(1.0)  # purge runs on its own timer: give it the chance it must not take
    # Undo older than the view may still be purged (the load's own), so count only the 200.
    assert history() >= 200
    pressure.stop()
    assert pressure.fault_end is not None
    wait_until(lambda: open_transactions() == [], 5, INNODB_TRX_POLL, "the transaction ended")


def test_readers_scan_the_table_until_stopped_mid_scan(server):
    pressure = Readers(server.port, 4)
    pressure.start()
    wait_until(lambda: pressure.counts["scans"] >= 8, 30, what="8 scans")
    began = time.monotonic()
    pressure.stop(30)
    assert time.monotonic() - began < 10
    assert not any(t.is_alive() for t in pressure._threads)
    sessions = server.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT status%'")
    assert sessions == [(0,)]


def test_dump_runs_mariadb_dump_again_and_again(server):
    pressure = Dump(server.port)
    pressure.start()
    wait_until(lambda: pressure.counts["dumps"] >= 2, 60, what="2 dumps")
    pressure.stop(30)
    assert pressure.counts["failed"] == 0 and pressure.counts["mean seconds"] is not None
    assert pressure._proc is not None and pressure._proc.poll() is not None


def test_the_killer_kills_tidemqs_connections_only(server):
    apps = [_app(server.port) for _ in range(3)]
    mine = connect(server.port)
    pressure = ConnectionKiller(server.port, 20)
    pressure.start()
    try:
        wait_until(lambda: not any(_alive(c) for c in apps), 20, what="tidemq's connections killed")
    finally:
        pressure.stop()
    assert pressure.counts["killed"] >= 3
    assert _alive(mine)
    mine.close()


def test_the_hog_takes_every_free_connection_and_gives_them_back(server):
    pressure = ConnectionHog(server.port)
    pressure.start()
    try:
        wait_until(lambda: pressure.counts["seconds to fill"] is not None, 60, what="max_connections reached")
        with pytest.raises(pymysql.err.OperationalError) as refused:
            _app(server.port)
        assert refused.value.args[0] == 1040  # Too many connections
        assert pressure.counts["held"] >= 30
    finally:
        pressure.stop()
    _app(server.port).close()


def test_a_mariadb_outage_stops_and_starts_the_same_server(server):
    before = server.execute("SELECT COUNT(*) FROM tidemq_message", DATABASE)
    pressure = Outage(server, 2.0)
    began = time.time()
    pressure.start()
    wait_until(lambda: not server._ready(), 30, what="MariaDB stopped")
    pressure.stop()
    assert pressure.fault_end - began >= 2.0
    assert server.execute("SELECT COUNT(*) FROM tidemq_message", DATABASE) == before


def test_a_zookeeper_outage_outlasts_its_seconds_and_serves_again():
    zk = ZooKeeper().start()
    try:
        pressure = Outage(zk, 1.5)
        began = time.time()
        pressure.start()
        wait_until(lambda: zk.mode() == "", 30, what="ZooKeeper stopped")
        pressure.stop()
        assert pressure.fault_end - began >= 1.5 and zk.mode() == "standalone"
    finally:
        zk.cleanup()


class _Processes:
    """Stands in for the cluster: ``sleep`` processes as brokers and workers, the real kill."""

    kill = PressureCluster.kill

    def __init__(self, directory: str) -> None:
        self.dir, self.brokers, self.workers, self.killed = directory, [], [], {}
        self._lock = threading.Lock()
        self._n = 0

    def _start(self, group: list) -> Proc:
        self._n += 1
        proc = Proc(f"sleeper-{self._n}", ["sleep", "120"], {}, self.dir)
        group.append(proc)
        return proc

    def start_worker(self) -> Proc:
        return self._start(self.workers)

    def start_broker(self) -> Proc:
        return self._start(self.brokers)


@pytest.mark.parametrize("which", ["worker", "broker"])
def test_the_killer_of_processes_kills_the_oldest_and_starts_another(tmp_path, which):
    procs = _Processes(str(tmp_path))
    group = procs.workers if which == "worker" else procs.brokers
    first = [procs._start(group) for _ in range(2)]
    pressure = ProcessKiller(procs, which, 0.3)
    pressure.start()
    try:
        wait_until(lambda: pressure.counts["killed"] >= 3, 30, what="3 kills")
    finally:
        pressure.stop()
    assert len(group) == 2 and all(p.popen.poll() is None for p in group)
    assert all(exited(p.pid) for p in first) and {p.pid for p in first} <= procs.killed.keys()
    for p in group:
        p.stop()


def test_overload_raises_the_rate_while_it_lasts_and_every_kind_is_made():
    producer = SimpleNamespace(rate=100.0)
    pressure = Overload(producer, 300.0)
    pressure.start()
    assert producer.rate == 300.0
    pressure.stop()
    assert producer.rate == 100.0
    args = SimpleNamespace(readers=4, kills_per_second=10, outage_seconds=30, kill_every=20, overload=1.5)
    cluster = SimpleNamespace(port=1, mariadb=object(), zookeeper=object())
    made = {kind: type(make(kind, cluster, producer, 200.0, args)).__name__ for kind in KINDS}
    assert made["idle-view-10m"] == "IdleView" and made["zookeeper-stop"] == "Outage"
    assert make("overload", cluster, producer, 200.0, args).rate == 300.0
