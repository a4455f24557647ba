"""The database stays up but tidemq's connections do not: every one killed (``KILL CONNECTION``)
ten times a second, or the server's ``max_connections`` taken by other clients. Under produce and
consume load nothing acknowledged is lost, nothing runs twice, no process exits, each names the
fault at most once, failed produce calls fail with a retriable error within their deadline, and
consumption goes on during the fault and after it."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Optional

import pymysql
import pytest
from sqlalchemy.engine import make_url

from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.stack import Stack, claims, reruns, successes
from tests.processes import process_env
from tests.servers import wait_until
from tests.sqldb import open_sql
from tidemq import Client, clock
from tidemq_broker.storage import NewRow
from tidemq_broker.storages import database, open_storage

APP_USER = "tidemq_app"  # tidemq's processes connect as this user: no SUPER, no reserved connection
OTHERS = "tidemq_others"  # the other clients of a shared server
FAULT = 10.0  # seconds each fault lasts


def _admin(mariadb) -> pymysql.connections.Connection:
    return pymysql.connect(host="127.0.0.1", port=mariadb.port, user="root", autocommit=True)


@pytest.fixture
def app_url(mysql_url, mariadb):
    """The test database as a user of its own, so the fault can target tidemq's connections only
    (the test reads the outcome as root)."""
    database = make_url(mysql_url).database
    for user in (APP_USER, OTHERS):
        mariadb.execute(f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1'")
    mariadb.execute(f"GRANT ALL ON `{database}`.* TO '{APP_USER}'@'127.0.0.1'")
    return mysql_url.replace("root@", f"{APP_USER}@", 1)


class Killer:
    """Kills every connection of ``user`` ten times a second, from its own thread."""

    def __init__(self, mariadb, user: str, every: float = 0.1) -> None:
        self.conn = _admin(mariadb)
        self.user, self.every = user, every
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-killer")

    def _run(self) -> None:
        with self.conn.cursor() as cur:
            while not self._stop.wait(self.every):
                cur.execute("SELECT id FROM information_schema.processlist WHERE user = %s", (self.user,))
                for (connection_id,) in cur.fetchall():
                    with contextlib.suppress(pymysql.err.OperationalError):  # gone meanwhile
                        cur.execute(f"KILL CONNECTION {int(connection_id)}")
                        self.kills += 1

    def __enter__(self) -> "Killer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.conn.close()


class Crowd:
    """Other clients holding every connection the server allows: ``max_connections`` is lowered
    to what is open now plus a few, and those few are taken."""

    def __init__(self, mariadb) -> None:
        self.mariadb = mariadb
        self.admin = _admin(mariadb)
        self.held: list[pymysql.connections.Connection] = []
        self.limit = 0

    def __enter__(self) -> "Crowd":
        with self.admin.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.max_connections, COUNT(*) FROM information_schema.processlist")
            self.limit, open_now = cur.fetchone()
            cur.execute(f"SET GLOBAL max_connections = {int(open_now) + 5}")
        while True:
            try:
                self.held.append(pymysql.connect(host="127.0.0.1", port=self.mariadb.port, user=OTHERS))
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1040, exc  # Too many connections: every one is taken
                return self
            assert len(self.held) < 100, "the connection limit did not hold"

    def __exit__(self, *exc: object) -> None:
        for conn in self.held:
            conn.close()
        with self.admin.cursor() as cur:
            cur.execute(f"SET GLOBAL max_connections = {int(self.limit)}")
        self.admin.close()


def _run_fault(settings, app_url, spawn, tmp_path, topic: str, fault, pattern: str, named: bool = True) -> str:
    """Load, ``FAULT`` seconds of ``fault`` (a context manager), recovery; every check; the figures.
    ``named``: some process must name the fault (not when tidemq may not notice it at all)."""
    log = tmp_path / "runs.log"
    env = process_env(settings, TIDEMQ_DB_URL=app_url, FAULT_LOG=str(log), FAULT_TOPIC=topic, FAULT_TTR="3",
                      FAULT_SLEEP="0.002")
    stack = Stack(spawn, tmp_path, env, brokers=2, workers=2)
    client = Client(settings)
    load = ProduceLoad(client, topic, timeout=3.0, every=0.2)  # up to 250 messages/s
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 2, 30, what="two workers registered")
        load.start()
        wait_until(lambda: successes(storage, topic) >= 500, 60, what="consumption before the fault")
        with fault as injected:
            began, done = time.monotonic(), successes(storage, topic)
            wait_until(lambda: successes(storage, topic) >= done + 500, 60, 0.1, "consumption during the fault")
            time.sleep(max(0.0, began + FAULT - time.monotonic()))  # the fault lasts its full time
            during = successes(storage, topic) - done
        done = successes(storage, topic)
        wait_until(lambda: successes(storage, topic) >= done + 500, 30, 0.1, "consumption after the fault")
        load.stop()

        stack.assert_alive()
        figures = check_calls(load) + ", " + check_outcome(storage, topic, load.acked, log)
        twice = reruns(log)
        assert not twice, (f"{len(twice)} messages ran twice, none of their workers died: {sorted(twice)[:5]}; "
                           f"the first one's trace:\n{storage.reads.get_message(min(twice)).trace}")
        said = stack.assert_fault_named_once(pattern, named=named)
        waits = claims(storage, topic, log)
        return (f"{figures}, consumed during the {FAULT:.0f} s fault {during}, claim p50 "
                f"{waits[len(waits) // 2]:.3f} s p99 {waits[len(waits) * 99 // 100]:.3f} s max {waits[-1]:.3f} s, "
                f"{getattr(injected, 'kills', 0)} connections killed, records naming it: {said}")
    finally:
        load.stop()
        client.close()
        storage.close()


def test_connections_killed_ten_times_a_second(settings, app_url, mariadb, spawn, tmp_path, record_property):
    killer = Killer(mariadb, APP_USER)
    figures = _run_fault(settings, app_url, spawn, tmp_path, "fault.killed", killer, r"database|mysql|connection")
    assert killer.kills >= 50, f"only {killer.kills} connections killed: the fault did not happen"
    record_property("figures", figures)
    print(f"\nconnections killed: {figures}")


def test_max_connections_taken_by_other_clients(settings, app_url, mariadb, spawn, tmp_path, record_property):
    # The pools keep the connections they have: tidemq notices only if it needs one more.
    figures = _run_fault(settings, app_url, spawn, tmp_path, "fault.crowded", Crowd(mariadb),
                         r"database|mysql|connection", named=False)
    record_property("figures", figures)
    print(f"\nmax_connections taken: {figures}")


@pytest.mark.parametrize("kind", ["produce", "read"])
def test_a_connection_that_cannot_be_opened_does_not_hide_an_open_one(app_url, mariadb, monkeypatch, kind):
    """The broker keeps a few autocommit connections per kind of work (group commits of plain
    rows, reads). Two units at once: one on the open connection, the other on an empty slot,
    whose connect fails because other clients hold every connection the server allows and that
    ends after the first unit gave its connection back. The second unit then runs on that
    connection, and so does every later unit: before, the empty slot went back on top and every
    later unit tried to connect, and failed, for as long as the server stayed full."""
    storage, db = open_sql(app_url)
    now = clock.now()

    def unit(hold: Optional[threading.Event] = None) -> object:
        def work(conn):
            if hold is not None:
                holding.set()
                assert hold.wait(10)
            return conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        return db.commit_alone(work) if kind == "produce" else db.read(work)

    real_connect = database._autocommit_connection
    first_back = threading.Event()

    def connect_once_the_first_is_back(engine):
        assert first_back.wait(10)
        return real_connect(engine)

    try:
        opened = unit()  # the one connection of this kind, open before the server fills up
        holding, release = threading.Event(), threading.Event()
        first = threading.Thread(target=lambda: (unit(release), first_back.set()))
        first.start()
        assert holding.wait(10)  # the open connection is in use
        with Crowd(mariadb):
            monkeypatch.setattr(database, "_autocommit_connection", connect_once_the_first_is_back)
            second_ran: list[object] = []
            second = threading.Thread(target=lambda: second_ran.append(unit()))
            second.start()  # takes the empty slot, waits to connect until the first is back
            release.set()
            first.join(10)
            second.join(10)
            assert second_ran == [opened]  # refused (1040) a new one, it took the one given back
            monkeypatch.setattr(database, "_autocommit_connection", real_connect)
            # The server is still full: only the open connection can serve, and it does.
            assert [unit() for _ in range(3)] == [opened] * 3
            stored = storage.messages.insert_messages([NewRow("t.full", '"x"', now, 0)], now) \
                if kind == "produce" else None
        if stored is not None:
            assert storage.reads.get_message(stored[0]).data == '"x"'
    finally:
        storage.close()


@pytest.mark.parametrize("produce", [False, True], ids=["transaction", "produce-transaction"])
def test_a_transaction_refused_a_new_connection_takes_an_idle_kept_one(app_url, mariadb, produce):
    """The kept autocommit connections are taken from the transactions' pool and stay out of
    it, so a full server can leave the pool with none of its own: then every transaction (a
    worker's heartbeats, a produce that hands its rows to a waiting pull) was refused while
    idle kept connections sat beside it. One of them now goes back to the pool for it, and its
    kind of work opens its slot again from the pool once the transaction is done."""
    storage, db = open_sql(app_url)
    engine = db.produce_engine if produce else db.engine

    def connection_id(conn) -> int:
        return conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()

    def kept_unit() -> int:
        return db.commit_alone(connection_id) if produce else db.read(connection_id)

    try:
        kept = kept_unit()
        assert engine.pool.checkedin() == 0, "the pool keeps a connection of its own: nothing to show"
        with Crowd(mariadb):
            assert db.tx(connection_id, produce=produce) == kept
            assert kept_unit() == kept
    finally:
        storage.close()


def test_a_group_commit_refused_a_new_connection_goes_by_a_transaction(app_url, mariadb, monkeypatch):
    """A group commit of plain rows has connections of its own beside the transactions' pool.
    With none of its own open, the pool's one connection busy and the server full, its new
    connection is refused: nothing was sent, so the rows go by a transaction, which has the
    pool's connection as soon as it is free, instead of failing the produce."""
    storage, db = open_sql(app_url)
    now = clock.now()
    refused, holding, release = threading.Event(), threading.Event(), threading.Event()
    real_connect = database._autocommit_connection

    def connect(engine):
        try:
            return real_connect(engine)
        except Exception:
            refused.set()
            raise

    def hold(conn) -> None:
        holding.set()
        assert release.wait(10)

    try:
        db.tx(lambda conn: None, produce=True)  # the produce pool's one connection
        holder = threading.Thread(target=lambda: db.tx(hold, produce=True))
        holder.start()
        assert holding.wait(10)
        with Crowd(mariadb):
            monkeypatch.setattr(database, "_autocommit_connection", connect)
            stored: list[list[int]] = []
            producer = threading.Thread(target=lambda: stored.append(
                storage.messages.insert_messages([NewRow("t.full", '"y"', now, 0)], now)))
            producer.start()
            assert refused.wait(10)  # its own slot empty, the pool's connection busy: refused
            release.set()
            holder.join(10)
            producer.join(20)
            assert stored, "the group commit failed"
        assert storage.reads.get_message(stored[0][0]).data == '"y"'
    finally:
        release.set()
        storage.close()
