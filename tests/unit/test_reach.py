"""storages/reach.py: a database gone silent told from a slow one, by the units of work in
flight and a probe, on a clock and a connect of the test's own."""

from __future__ import annotations

import socket
import sqlite3
import threading

import pytest
from pymysql.err import OperationalError
from sqlalchemy import create_engine, text

from tidemq.errors import DatabaseOutOfReachError, StorageUnavailableError
from tidemq_broker.storages.failover import Addresses
from tidemq_broker.storages.reach import Reach


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Server:
    """What a probe's connect meets: an answer, a refusal, or silence."""

    def __init__(self) -> None:
        self.state = "answers"
        self.probes = 0

    def connect(self, timeout: int):
        self.probes += 1
        if self.state == "silent":
            raise OperationalError(2013, f"Lost connection to MySQL server during query (timed out after {timeout} s)")
        if self.state == "full":
            raise OperationalError(1040, "Too many connections")
        if self.state == "stopped":
            error = OperationalError(2003, "Can't connect to MySQL server (Connection refused)")
            error.original_exception = ConnectionRefusedError(111, "Connection refused")
            raise error
        return _Closable()


class _Closable:
    def close(self) -> None:
        pass


class _Connection(sqlite3.Connection):
    """A driver connection with a socket where PyMySQL keeps its own."""

    _sock = None


@pytest.fixture
def engine():
    engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(":memory:", factory=_Connection,
                                                                         check_same_thread=False))
    yield engine
    engine.dispose()


def _reach(engine, clock, server):
    return Reach([engine], stall=2.0, every=1.0, clock=clock, watch=False, connect=server.connect)


def test_a_unit_in_flight_with_no_answer_and_a_silent_probe_puts_the_database_out_of_reach(engine):
    clock, server = Clock(), Server()
    reach = _reach(engine, clock, server)
    with reach:
        clock.now += 1.9
        reach.tick()
        assert server.probes == 0, "probed before the stall"
        server.state = "silent"
        clock.now += 0.2
        reach.tick()
    assert reach.out_of_reach
    with pytest.raises(DatabaseOutOfReachError, match="no answer from the database") as raised:
        with reach:
            pass
    assert isinstance(raised.value, StorageUnavailableError), "callers that know storage errors still catch it"

    clock.now += 0.5
    reach.tick()
    assert server.probes == 1, "probed again before `every` passed"
    server.state = "answers"
    clock.now += 0.5
    reach.tick()
    assert not reach.out_of_reach
    with reach:
        pass


@pytest.mark.parametrize("state", ["answers", "full", "stopped"])
def test_a_probe_that_gets_an_answer_means_slow_not_gone(engine, state):
    clock, server = Clock(), Server()
    reach = _reach(engine, clock, server)
    server.state = state
    with reach:
        clock.now += 2.5
        reach.tick()
        assert server.probes == 1 and not reach.out_of_reach
        clock.now += 1.0
        reach.tick()
        assert server.probes == 1, "probed again before another stall"
        clock.now += 1.0
        reach.tick()
        assert server.probes == 2
    assert not reach.out_of_reach


def test_idle_or_busy_and_answering_is_never_probed(engine):
    clock, server = Clock(), Server()
    reach = _reach(engine, clock, server)
    server.state = "silent"
    clock.now += 60
    reach.tick()  # nothing in flight
    for _ in range(30):  # units that keep ending
        with reach:
            clock.now += 0.5
        reach.tick()
    with reach:  # one begins after a long idle: its stall counts from its start
        clock.now += 1.0
        reach.tick()
    assert server.probes == 0 and not reach.out_of_reach


def test_going_out_of_reach_shuts_the_connections_in_use(engine):
    clock, server = Clock(), Server()
    reach = _reach(engine, clock, server)
    a, b = socket.socketpair()
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        conn.connection.dbapi_connection._sock = a
        got = []
        reader = threading.Thread(target=lambda: got.append(a.recv(1)))
        reader.start()
        with reach:
            server.state = "silent"
            clock.now += 3
            reach.tick()
        reader.join(5)
        assert not reader.is_alive() and got == [b""], "a read in flight was not ended"
    b.close()
    a.close()


def test_connections_given_back_or_dropped_are_not_held(engine):
    reach = _reach(engine, Clock(), Server())
    with engine.connect() as kept:
        kept.execute(text("SELECT 1"))
        assert len(reach._in_use) == 1
    assert not reach._in_use, "a connection given back is still counted in use"
    conn = engine.connect()
    conn.execute(text("SELECT 1"))
    conn.invalidate()  # lost: checked in as None
    conn.close()
    assert not reach._in_use, "an invalidated connection is still held"


def test_of_several_addresses_a_silent_one_in_use_is_left_for_one_that_answers(engine):
    """A Galera cluster's node cut off from this process alone: not the database out of reach."""
    clock, servers = Clock(), {("db1", 3306): Server(), ("db2", 3306): Server()}
    addresses = Addresses(list(servers))
    reach = Reach([engine], stall=2.0, every=1.0, clock=clock, watch=False, addresses=addresses,
                  connect=lambda timeout, address: servers[address].connect(timeout))
    servers["db1", 3306].state = "silent"
    with reach:
        clock.now += 2.5
        reach.tick()
    assert not reach.out_of_reach and addresses.current == ("db2", 3306)
    assert servers["db1", 3306].probes == servers["db2", 3306].probes == 1

    servers["db2", 3306].state = "silent"  # every address silent: out of reach
    with reach:
        clock.now += 2.5
        reach.tick()
    assert reach.out_of_reach
    servers["db1", 3306].state = "answers"
    clock.now += 1.0
    reach.tick()
    assert not reach.out_of_reach and addresses.current == ("db1", 3306)


def test_several_addresses_are_probed_at_once(engine):
    """A probe takes as long with two silent nodes as with one: each waits out its timeout beside the others."""
    clock = Clock()
    servers = {("db1", 3306): Server(), ("db2", 3306): Server(), ("db3", 3306): Server()}
    servers["db1", 3306].state = servers["db2", 3306].state = "silent"
    begun = threading.Barrier(len(servers), timeout=5)

    def connect(timeout, address):
        begun.wait()  # passes only once every address's probe has begun: one by one, none would
        return servers[address].connect(timeout)

    addresses = Addresses(list(servers))
    reach = Reach([engine], stall=2.0, every=1.0, clock=clock, watch=False, addresses=addresses, connect=connect)
    with reach:
        clock.now += 2.5
        reach.tick()
    assert not begun.broken, "the addresses were probed one after another"
    assert not reach.out_of_reach and addresses.current == ("db3", 3306)
    assert [server.probes for server in servers.values()] == [1, 1, 1]
