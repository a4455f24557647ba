"""Acks and heartbeats of leases a broker granted are authorized on the topics its pulls leased,
without reading them; any other lease still reads its messages' topics, and a caller whose
token does not cover a message's topic is refused either way."""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Iterator

import grpc
import pytest

from tidemq import clock
from tidemq.rpc import tidemq_pb2 as pb
from tidemq_broker.auth import CALLER
from tidemq_broker.lease_grants import LeaseGrants
from tidemq_broker.storage import LeasedMessage, LockRequest, Principal, Shard

from .test_broker_service import Aborted, Context, memory_service, produce, pull, stored

ORDERS = Principal("orders-worker", "consumer", ("orders.*",), "0" * 64, datetime(2026, 1, 1))
BILLING = Principal("billing-worker", "consumer", ("billing.*",), "1" * 64, datetime(2026, 1, 1))
EVERYTHING = Principal("all-worker", "consumer", ("*",), "2" * 64, datetime(2026, 1, 1))
TOKEN = "ab" * 16


@contextlib.contextmanager
def calling_as(principal: Principal) -> Iterator[None]:
    caller = CALLER.set(principal)
    try:
        yield
    finally:
        CALLER.reset(caller)


@pytest.fixture
def broker():
    with memory_service() as service:
        yield service


@pytest.fixture
def reads(broker, monkeypatch) -> list[list[int]]:
    """The ids of every read of messages' topics the broker makes."""
    seen: list[list[int]] = []
    real = broker.storage.reads.message_topics

    def counted(ids):
        seen.append(sorted(ids))
        return real(ids)

    monkeypatch.setattr(broker.storage.reads, "message_topics", counted)
    return seen


def ack(broker, id: int, token: str) -> list:
    items = [pb.AckItem(id=id, lease_token=token, success=True)]
    return list(broker.Ack(pb.AckRequest(items=items, consumer="c1", topic="orders.a"), Context()).outcomes)


def extend(broker, id: int, token: str) -> list:
    request = pb.ExtendRequest(leases=[pb.LeaseRef(id=id, lease_token=token)], ttr_seconds=30)
    return list(broker.Extend(request, Context()).extended)


def test_a_lease_pulled_here_is_extended_touched_and_acked_without_reading_its_topic(broker, reads):
    [msg_id] = produce(broker, "orders.a", "1")
    with calling_as(ORDERS):
        [got] = pull(broker, "orders.a", ttr_seconds=30)
        assert extend(broker, msg_id, got.lease_token) == [True]
        assert broker.Touch(pb.TouchRequest(id=msg_id, lease_token=got.lease_token, ttr_seconds=30),
                            Context()).extended
        assert ack(broker, msg_id, got.lease_token) == [pb.APPLIED]
    assert reads == [] and stored(broker, msg_id).status == "SUCCESS"
    assert len(broker.grants) == 0  # the ack ended the lease: nothing is kept for it


def test_a_caller_not_covering_a_leased_messages_topic_is_refused_with_its_token(broker, reads):
    [msg_id] = produce(broker, "orders.a", "1")
    [billing_id] = produce(broker, "billing.b", "1")
    with calling_as(ORDERS):
        [got] = pull(broker, "orders.a", ttr_seconds=30, lease_token=TOKEN)
    with calling_as(BILLING):
        # The same client-named token on a pull of its own topic grants nothing for the other's.
        [mine] = pull(broker, "billing.b", ttr_seconds=30, lease_token=TOKEN)
        for call in (lambda: ack(broker, msg_id, got.lease_token), lambda: extend(broker, msg_id, TOKEN),
                     lambda: broker.Touch(pb.TouchRequest(id=msg_id, lease_token=TOKEN, ttr_seconds=5), Context())):
            with pytest.raises(Aborted) as denied:
                call()
            assert denied.value.code is grpc.StatusCode.PERMISSION_DENIED and "orders.a" in denied.value.details
        assert ack(broker, mine.id, TOKEN) == [pb.APPLIED]
    assert reads == []  # every pair was one this broker leased
    assert stored(broker, msg_id).status == "RUNNING" and stored(broker, billing_id).status == "SUCCESS"


def test_a_lease_granted_elsewhere_reads_its_topics_once_per_call(broker, reads):
    ids = produce(broker, "orders.a", "1", "2")
    now = clock.now()
    leased = broker.storage.leases.lock_batch(LockRequest(Shard("orders.a"), "other broker", 30, now, limit=2))
    token = leased[0].lease_token
    with calling_as(BILLING):
        with pytest.raises(Aborted) as denied:
            extend(broker, ids[0], token)
        assert denied.value.code is grpc.StatusCode.PERMISSION_DENIED
    with calling_as(ORDERS):
        assert extend(broker, ids[0], token) == [True]
        items = [pb.AckItem(id=id, lease_token=token, success=True) for id in ids]
        assert list(broker.Ack(pb.AckRequest(items=items, consumer="c1"), Context()).outcomes) == [pb.APPLIED] * 2
    assert reads == [[ids[0]], [ids[0]], ids]


def test_a_caller_covering_every_topic_leaves_nothing_behind_and_reads_nothing(broker, reads):
    [msg_id] = produce(broker, "orders.a", "1")
    with calling_as(EVERYTHING):
        [got] = pull(broker, "orders.a", ttr_seconds=30)
        assert len(broker.grants) == 0
        assert ack(broker, msg_id, got.lease_token) == [pb.APPLIED]
    assert reads == []


def _leased(id: int, topic: str = "t.a", token: str = TOKEN) -> LeasedMessage:
    return LeasedMessage(id=id, topic=topic, data="1", effect_time=clock.now(), retry_remaining=0, attempt=1,
                         status="RUNNING", ttr=30, consumer="c1", lease_token=token)


def test_grants_are_bounded_by_count_and_age_and_fall_back_to_the_read(monkeypatch):
    grants, now = LeaseGrants(limit=3, max_age=60), [100.0]
    monkeypatch.setattr("tidemq_broker.lease_grants.time.monotonic", lambda: now[0])
    asked: list[list[int]] = []

    def read(ids: list[int]) -> set[str]:
        asked.append(ids)
        return {"t.read"}

    with calling_as(ORDERS):
        grants.remember([_leased(i) for i in (1, 2, 3, 4)])
        assert len(grants) == 3  # the oldest went first
        assert grants.topics([(2, TOKEN), (4, TOKEN)], read) == {"t.a"} and asked == []
        assert grants.topics([(1, TOKEN), (2, TOKEN), (2, "cd" * 16)], read) == {"t.a", "t.read"}
        assert asked == [[1, 2]]
        now[0] += 61
        grants.remember([_leased(5, "t.b")])
        assert len(grants) == 1 and grants.topics([(5, TOKEN)], read) == {"t.b"}
        grants.forget([(5, TOKEN), (6, TOKEN)])
        assert len(grants) == 0
    grants.remember([_leased(7)])  # no caller: no authentication, nothing to remember
    assert len(grants) == 0
