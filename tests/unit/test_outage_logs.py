"""A fault is logged once, not once per failed retry: the Outage record, the broker pool's view of
dead brokers, and kazoo's reconnection warnings. No servers."""

from __future__ import annotations

import logging

import pytest

from tests.servers import free_port
from tidemq.coordinators.zk_session import KazooLog
from tidemq.errors import BrokerUnavailableError, StorageUnavailableError
from tidemq.outage import Outage
from tidemq.pool import BrokerPool
from tidemq.rpc import tidemq_pb2 as pb

log = logging.getLogger("tests.outage")


def _messages(caplog, level=logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_an_outage_is_logged_when_it_starts_and_when_it_ends(caplog):
    caplog.set_level(logging.INFO, logger="tests.outage")
    outage = Outage(log, "calls to the database")
    assert outage.succeeded() is None and not outage.down
    assert outage.failed(StorageUnavailableError("refused"))
    for _ in range(50):
        assert not outage.failed(StorageUnavailableError("refused"))
    assert outage.down
    assert outage.succeeded() is not None and not outage.down
    warnings, infos = _messages(caplog), _messages(caplog, logging.INFO)
    assert warnings == ["calls to the database fail: StorageUnavailableError: refused; retrying, and saying so "
                        "again only once one succeeds"]
    assert len(infos) == 2 and "succeed again after" in infos[1] and "(51 failed meanwhile)" in infos[1]


def test_outages_that_keep_coming_back_are_counted_not_logged_each_time(caplog):
    caplog.set_level(logging.INFO, logger="tests.outage")
    outage = Outage(log, "calls to the database", quiet=60.0)
    for _ in range(20):  # a connection killed ten times a second: brief failures between successes
        outage.failed(StorageUnavailableError("lost"))
        outage.succeeded()
    assert len(_messages(caplog)) == 1 and len(_messages(caplog, logging.INFO)) == 2
    outage._announced_at -= 61  # the quiet period is over: the next outage is said again, with the count
    outage.failed(StorageUnavailableError("lost"))
    warnings = _messages(caplog)
    assert len(warnings) == 2 and "(19 failed attempts in brief outages before this one were not logged)" in warnings[1]


def test_a_dead_broker_is_logged_once_however_many_calls_find_it_dead(caplog):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]  # nothing listens there
    pool = BrokerPool(tuple(dead))
    caplog.set_level(logging.DEBUG, logger="tidemq.pool")
    try:
        for _ in range(5):
            with pytest.raises(BrokerUnavailableError):
                pool.call("Cancel", pb.CancelRequest(ids=[1]), timeout=0.5)
    finally:
        pool.close()
    warnings = _messages(caplog)
    for address in dead:
        assert sum(message.startswith(f"broker {address} does not answer") for message in warnings) == 1, warnings
    assert sum("calls to tidemq's brokers fail" in message for message in warnings) == 1, warnings
    assert len(warnings) == 3


def test_kazoo_reconnection_warnings_are_kept_as_the_reason_not_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="kazoo.client")
    logging.getLogger("kazoo.client").setLevel(logging.WARNING)  # as the CLI sets it
    try:
        kazoo_log = KazooLog()
        for _ in range(10):  # what kazoo says on every attempt while ZooKeeper is away
            kazoo_log.warning("Connection dropped: %s", "socket connection error: Connection refused")
            kazoo_log.warning("Transition to CONNECTING")
        kazoo_log.warning("something else")
    finally:
        logging.getLogger("kazoo.client").setLevel(logging.NOTSET)
    assert _messages(caplog) == ["something else"]
    assert kazoo_log.reason == "Connection dropped: socket connection error: Connection refused"
