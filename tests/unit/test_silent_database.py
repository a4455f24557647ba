"""A MySQL URL whose address accepts connections and never answers (a proxy whose server is
gone, a partition): the storage fails within its connect timeout, not PyMySQL's read timeout,
then finds the database out of reach and fails at once without touching the network."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from sqlalchemy import text

from tests.background import InThread
from tests.servers import wait_until
from tidemq.errors import DatabaseOutOfReachError, StorageUnavailableError
from tidemq_broker.storages import open_database


@pytest.fixture
def silent_address():
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])  # held open, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for sock in accepted:
        sock.close()


def test_a_silent_database_fails_within_the_connect_timeout_then_at_once(silent_address):
    db = open_database(f"mysql+pymysql://root@{silent_address}/tidemq")
    try:
        began = time.monotonic()
        with pytest.raises(StorageUnavailableError):
            db.read(lambda conn: conn.execute(text("SELECT 1")).all())
        first = time.monotonic() - began
        assert first < 10, f"a connection never answered took {first:.1f} s to fail (PyMySQL's read timeout is 30)"

        with pytest.raises(StorageUnavailableError):  # in flight past the stall: probed, found silent
            db.tx(lambda conn: conn.execute(text("SELECT 1")).all())
        wait_until(lambda: db.reach.out_of_reach, 15, 0.05, "the silence to be found")
        began = time.monotonic()
        with pytest.raises(DatabaseOutOfReachError, match="no answer from the database"):
            db.tx(lambda conn: conn.execute(text("SELECT 1")).all())
        assert time.monotonic() - began < 1, "out of reach, a unit of work still waited on the network"
    finally:
        db.close()


def test_a_unit_that_fails_after_the_silence_was_found_logs_nothing_more(silent_address, caplog):
    """A read's second connection is still waiting for its greeting (3 s) when the broker finds
    the silence (a stall of 1 s, then a probe of up to 2 s): it fails about then, on its own
    timeout. It sent nothing, so it is the broker's failure (out of reach), and the fault was
    named once, by reach.py (before any unit could fail for it), not again by the outage of the
    calls to the database."""
    db = open_database(f"mysql+pymysql://root@{silent_address}/tidemq")
    try:
        caplog.set_level(logging.INFO, logger="tidemq_broker.storages.database")
        unit = InThread(db.read, lambda conn: conn.execute(text("SELECT 1")).all())
        assert isinstance(unit.outcome(15), DatabaseOutOfReachError), unit.error
        assert db.reach.out_of_reach
        lines = [r.getMessage() for r in caplog.records if r.name == "tidemq_broker.storages.database"]
        assert len(lines) == 1 and "no answer from the database" in lines[0], lines
    finally:
        db.close()
