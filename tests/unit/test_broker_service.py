"""The broker's gRPC service over the memory storage, without a server or a database: Produce
through the group commit, Pull's lock and long-poll, a lock handed back when the caller is gone,
Ack, and how tidemq errors become gRPC status codes."""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime
from types import SimpleNamespace
from typing import Iterator, Optional

import grpc
import prometheus_client
import pytest

from tests.background import InThread
from tests.servers import wait_until
from tidemq import clock
from tidemq.rpc import tidemq_pb2 as pb
from tidemq_broker.auth import CALLER
from tidemq_broker.errors import StorageUnavailableError
from tidemq_broker.pulls import PullHub
from tidemq_broker.service import ERROR_KEY, BrokerService
from tidemq_broker.storage import Principal, TopicSettings
from tidemq_broker.storages.database import NoConnectionError
from tidemq_broker.storages.memory import open_memory_storage
from tidemq_broker.topics import TopicCache
from tidemq_broker.writer import GroupCommitWriter

TOKEN = "ab" * 16


class Aborted(Exception):
    """What ``context.abort`` raises (grpc raises its own exception there too)."""

    def __init__(self, code: grpc.StatusCode, details: str, error: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details, self.error = code, details, error


class Context:
    """A call's context as the service uses it. ``gone_after``: the number of ``is_active``
    answers before the caller cancels (None: never)."""

    def __init__(self, remaining: Optional[float] = None, gone_after: Optional[int] = None) -> None:
        self._remaining, self._gone_after, self._asked = remaining, gone_after, 0
        self._trailing: tuple = ()

    def time_remaining(self) -> Optional[float]:
        return self._remaining

    def is_active(self) -> bool:
        self._asked += 1
        return self._gone_after is None or self._asked <= self._gone_after

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def set_trailing_metadata(self, metadata: tuple) -> None:
        self._trailing = metadata

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details, dict(self._trailing).get(ERROR_KEY, ""))


@contextlib.contextmanager
def memory_service() -> Iterator[BrokerService]:
    """A BrokerService as a BrokerServer assembles it, on a memory storage."""
    storage = open_memory_storage()
    topics = TopicCache(storage.topics)
    hub = PullHub(storage.probes, recheck=60)
    writer = GroupCommitWriter(storage.messages, topics, "b:1", hub.notify_commit)
    hub.start()
    try:
        yield BrokerService(storage, topics, writer, hub, "b:1", max_data_bytes=1024)
    finally:
        hub.stop()
        writer.stop()


@pytest.fixture
def broker():
    with memory_service() as service:
        yield service


def produce(broker, topic: str, *datas: str, request_id: str = "", delay: Optional[float] = None, retry: int = -1):
    when = {"delay_seconds": delay} if delay is not None else {}
    request = pb.ProduceRequest(messages=[pb.NewMessage(topic=topic, data=d, retry=retry, **when) for d in datas],
                                request_id=request_id)
    return list(broker.Produce(request, Context()).ids)


def pull(broker, topic: str, wait: float = 0.0, context: Optional[Context] = None, **fields) -> list:
    request = pb.PullRequest(topic=topic, max_messages=fields.pop("max_messages", 10), wait_seconds=wait,
                             total=fields.pop("total", 1), consumer="c1", **fields)
    return list(broker.Pull(request, context or Context()).messages)


def stored(broker, id: int):
    return broker.storage.reads.get_message(id)


def test_produce_commits_the_rows_and_a_retried_call_gets_its_first_answer(broker):
    ids = produce(broker, "s.produce", '{"n": 1}', '{"n": 2}', request_id="call-1")
    assert [stored(broker, i).data for i in ids] == ['{"n": 1}', '{"n": 2}']
    assert {stored(broker, i).status for i in ids} == {"NEW"}
    assert stored(broker, ids[0]).retry_remaining == TopicSettings("s.produce").retry_count  # the topic's default
    assert produce(broker, "s.produce", '{"n": 1}', '{"n": 2}', request_id="call-1") == ids
    assert broker.storage.counts.count_by_status("s.produce") == {"s.produce": {"NEW": 2}}


def test_a_bad_message_refuses_the_whole_request_with_invalid_argument(broker):
    with pytest.raises(Aborted) as refused:
        produce(broker, "s.bad", '{"ok": 1}', '{"ok": 2', request_id="call-2")
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.error == "InvalidDataError" and "message #1" in refused.value.details
    assert broker.storage.counts.count_by_status() == {}
    with pytest.raises(Aborted) as too_large:
        produce(broker, "s.bad", '"' + "x" * 2000 + '"')
    assert too_large.value.error == "DataTooLargeError" and "1024" in too_large.value.details


def test_pull_leases_what_is_due_once_and_ack_records_each_outcome(broker):
    ids = produce(broker, "s.pull", "1", "2", "3")
    produce(broker, "s.pull", '"later"', delay=60)
    got = pull(broker, "s.pull", ttr_seconds=30)
    assert [m.id for m in got] == ids and len({m.lease_token for m in got}) == 1
    assert {stored(broker, i).status for i in ids} == {"RUNNING"} and pull(broker, "s.pull") == []
    token = got[0].lease_token
    items = [pb.AckItem(id=ids[0], lease_token=token, success=True),
             pb.AckItem(id=ids[1], lease_token=token, success=False, error="boom"),
             pb.AckItem(id=ids[2], lease_token="cd" * 16, success=True)]
    reply = broker.Ack(pb.AckRequest(items=items, consumer="c1", topic="s.pull"), Context())
    assert list(reply.outcomes) == [pb.APPLIED, pb.APPLIED, pb.STALE]
    assert [stored(broker, i).status for i in ids] == ["SUCCESS", "NEW", "RUNNING"]
    assert stored(broker, ids[1]).retry_remaining == TopicSettings("s.pull").retry_count - 1


def test_a_waiting_pull_gets_a_message_committed_while_it_waits(broker):
    waiting = InThread(pull, broker, "s.wait", 30.0)
    wait_until(lambda: broker.hub._waiters.get("s.wait"), 10, what="the pull to wait")
    [msg_id] = produce(broker, "s.wait", '"hello"')
    [got] = waiting.value(10)  # woken by the commit: 20 s before its own deadline
    assert (got.id, got.data) == (msg_id, '"hello"')


def test_a_pull_sleeps_until_its_shards_next_message_is_due(broker):
    started = clock.now()  # before the produce: its effect time is at least this + 0.3 s
    [msg_id] = produce(broker, "s.due", "1", delay=0.3)
    [got] = pull(broker, "s.due", 10.0)
    assert got.id == msg_id and clock.now() >= clock.after(started, 0.3)
    assert clock.from_epoch_ms(got.effect_time_ms) <= clock.now()


def test_a_lock_made_after_the_caller_left_is_handed_back_at_once(broker):
    [msg_id] = produce(broker, "s.gone", "1")
    # Active while the pull locks (its check before the lock), gone when the reply would leave.
    assert pull(broker, "s.gone", context=Context(gone_after=1)) == []
    back = stored(broker, msg_id)
    assert (back.status, back.attempt, back.lease_token) == ("NEW", 0, None)
    assert "RELEASED" in back.trace
    assert [m.id for m in pull(broker, "s.gone")] == [msg_id]  # due again at once


def test_a_serial_topic_hands_out_its_head_only_until_it_is_acknowledged(broker):
    ids = produce(broker, "s.serial", "1", "2")
    [head] = pull(broker, "s.serial", serial=True)
    assert head.id == ids[0] and pull(broker, "s.serial", serial=True) == []
    broker.Ack(pb.AckRequest(items=[pb.AckItem(id=head.id, lease_token=head.lease_token, success=True)],
                             consumer="c1", topic="s.serial"), Context())
    assert [m.id for m in pull(broker, "s.serial", serial=True)] == [ids[1]]


def test_extend_release_cancel_and_requeue(broker, monkeypatch):
    ids = produce(broker, "s.more", "1", "2")
    [first] = pull(broker, "s.more", max_messages=1, lease_token=TOKEN)
    leases = [pb.LeaseRef(id=first.id, lease_token=TOKEN), pb.LeaseRef(id=first.id, lease_token="cd" * 16)]
    assert list(broker.Extend(pb.ExtendRequest(leases=leases, ttr_seconds=90), Context()).extended) == [True, False]
    reopened: list[str] = []  # NEW again at old effect times: the other brokers are told
    monkeypatch.setattr(broker, "signals", SimpleNamespace(reopened=reopened.extend, watch=lambda topic: None))
    assert broker.Release(pb.ReleaseRequest(lease_token=TOKEN), Context()).released == 1
    assert reopened == ["s.more"]
    monkeypatch.undo()
    back = stored(broker, first.id)
    assert (back.status, back.attempt) == ("NEW", 0)
    pull(broker, "s.more", max_messages=1)  # the first one again: RUNNING, not cancelled below
    assert list(broker.Cancel(pb.CancelRequest(ids=[ids[0], ids[1], 10**9]), Context()).cancelled) == \
        [False, True, False]
    dead = produce(broker, "s.dead", '"a"', '"b"', retry=0)
    failures = [pb.AckItem(id=m.id, lease_token=m.lease_token, success=False, error="x")
                for m in pull(broker, "s.dead")]
    broker.Ack(pb.AckRequest(items=failures, consumer="c1"), Context())
    assert {stored(broker, i).status for i in dead} == {"FAIL"}
    assert broker.Requeue(pb.RequeueRequest(topic="s.dead", retry=1), Context()).requeued == 2
    assert [(stored(broker, i).status, stored(broker, i).retry_remaining) for i in dead] == [("NEW", 1)] * 2


def test_errors_become_status_codes_that_name_the_error(broker, monkeypatch):
    with pytest.raises(Aborted) as malformed:
        broker.Pull(pb.PullRequest(topic="s.err", max_messages=0, total=1), Context())
    assert (malformed.value.code, malformed.value.error) == (grpc.StatusCode.INVALID_ARGUMENT, "MalformedRequestError")

    def away(*args, **kwargs):
        raise StorageUnavailableError("the database is unavailable (test)")

    monkeypatch.setattr(broker.storage.acks, "ack", away)
    with pytest.raises(Aborted) as unavailable:
        broker.Ack(pb.AckRequest(items=[pb.AckItem(id=1, lease_token=TOKEN, success=True)]), Context())
    assert (unavailable.value.code, unavailable.value.error) == (grpc.StatusCode.UNAVAILABLE,
                                                                  "StorageUnavailableError")

    def refused(*args, **kwargs):  # a class the broker keeps to itself: named as its public base
        raise NoConnectionError("the database is unavailable (test)")

    monkeypatch.setattr(broker.storage.acks, "ack", refused)
    with pytest.raises(Aborted) as unavailable:
        broker.Ack(pb.AckRequest(items=[pb.AckItem(id=1, lease_token=TOKEN, success=True)]), Context())
    assert (unavailable.value.code, unavailable.value.error) == (grpc.StatusCode.UNAVAILABLE,
                                                                  "StorageUnavailableError")
    [msg_id] = produce(broker, "s.err", "1")
    producer = Principal("p", "producer", ("s.*",), "0" * 64, datetime(2026, 1, 1))
    caller = CALLER.set(producer)
    try:
        with pytest.raises(Aborted) as denied:
            pull(broker, "s.err")
        assert (denied.value.code, denied.value.error) == (grpc.StatusCode.PERMISSION_DENIED, "PermissionDeniedError")
        with pytest.raises(Aborted) as elsewhere:
            produce(broker, "other.t", "1")
        assert elsewhere.value.code is grpc.StatusCode.PERMISSION_DENIED
        assert list(broker.Cancel(pb.CancelRequest(ids=[msg_id]), Context()).cancelled) == [True]
    finally:
        CALLER.reset(caller)


def test_a_paused_topic_hands_out_nothing(broker):
    produce(broker, "s.paused", "1")
    broker.storage.topics.save_topic(TopicSettings("s.paused", paused=True), clock.now())
    broker.topics.refresh()
    assert pull(broker, "s.paused") == []
    broker.storage.topics.save_topic(TopicSettings("s.paused"), clock.now())
    broker.topics.refresh()
    assert len(pull(broker, "s.paused")) == 1


def test_concurrent_pulls_never_share_a_message(broker):
    ids = produce(broker, "s.many", *[str(n) for n in range(200)])
    taken: list[int] = []
    guard = threading.Lock()

    def consume():
        while got := pull(broker, "s.many", max_messages=7):
            with guard:
                taken.extend(m.id for m in got)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(taken) == ids


def _produced(topic: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value("tidemq_messages_produced_total", {"topic": topic}) or 0.0


def test_a_produce_with_dependencies_waits_and_is_retried_by_its_request_id(broker):
    [parent] = produce(broker, "s.deps", "1")
    request = pb.ProduceRequest(messages=[pb.NewMessage(topic="s.deps", data="2", retry=-1, depends_on=[parent]),
                                          pb.NewMessage(topic="s.deps", data="3", retry=-1)], request_id="call-deps")
    before = _produced("s.deps")
    ids = list(broker.Produce(request, Context()).ids)
    assert [stored(broker, i).status for i in ids] == ["WAITING", "NEW"]
    assert _produced("s.deps") == before + 2
    assert list(broker.Produce(request, Context()).ids) == ids
    unknown = pb.ProduceRequest(messages=[pb.NewMessage(topic="s.deps", data="4", retry=-1, depends_on=[10 ** 9])])
    with pytest.raises(Aborted) as refused:
        broker.Produce(unknown, Context())
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.error == "UnknownDependencyError" and str(10 ** 9) in refused.value.details
    assert broker.storage.counts.count_by_status("s.deps") == {"s.deps": {"NEW": 2, "WAITING": 1}}


def test_a_produce_whose_messages_wait_on_each_other_is_a_workflow_and_a_cycle_is_refused(broker):
    chain = pb.ProduceRequest(messages=[pb.NewMessage(topic="s.flow", data=str(n), retry=-1, after=after)
                                        for n, after in enumerate(([], [0], [1]))])
    ids = list(broker.Produce(chain, Context()).ids)
    assert [stored(broker, i).status for i in ids] == ["NEW", "WAITING", "WAITING"]
    assert {stored(broker, i).workflow_id for i in ids} == {ids[0]}
    cycle = pb.ProduceRequest(messages=[pb.NewMessage(topic="s.flow", data="4", retry=-1, after=[1]),
                                        pb.NewMessage(topic="s.flow", data="5", retry=-1, after=[0])])
    with pytest.raises(Aborted) as refused:
        broker.Produce(cycle, Context())
    assert (refused.value.code, refused.value.error) == (grpc.StatusCode.INVALID_ARGUMENT, "DependencyCycleError")
    assert "step 0 -> step 1 -> step 0" in refused.value.details
    assert broker.storage.counts.count_by_status("s.flow") == {"s.flow": {"NEW": 1, "WAITING": 2}}


@pytest.fixture
def handing_broker():
    """The same BrokerService with a writer that hands what it commits to waiting pulls, as
    ``BrokerServer`` assembles it."""
    storage = open_memory_storage()
    topics = TopicCache(storage.topics)
    hub = PullHub(storage.probes, recheck=60)
    writer = GroupCommitWriter(storage.messages, topics, "b:1", hub.notify_commit, pulls=hub)
    # The insert watch's first look knows nothing yet and wakes every waiting pull: taken here,
    # before any pull waits, it cannot wake a test's pull between its opening and the produce
    # meant for it (which then found no pull to hand to, and the pull locked the row itself).
    assert hub._inserts.look() is None
    hub.start()
    yield BrokerService(storage, topics, writer, hub, "b:1", max_data_bytes=1024)
    hub.stop()
    writer.stop()


def _handed(topic: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value("tidemq_messages_handed_off_total", {"topic": topic}) or 0.0


def _open_pull(broker, topic: str) -> bool:
    with broker.hub._lock:
        return any(w.open for w in broker.hub._waiters.get(topic, ()))


def test_a_waiting_pull_is_handed_the_message_its_produce_committed_under_its_own_lease(handing_broker):
    broker = handing_broker
    waiting = InThread(lambda: pull(broker, "s.hand", 30.0, lease_token=TOKEN))
    wait_until(lambda: _open_pull(broker, "s.hand"), 10, what="the pull to wait")
    before = _handed("s.hand")
    [msg_id] = produce(broker, "s.hand", '"hi"')
    assert (stored(broker, msg_id).status, stored(broker, msg_id).lease_token) == ("RUNNING", TOKEN)
    [got] = waiting.value(10)
    assert (got.id, got.data, got.lease_token, got.attempt) == (msg_id, '"hi"', TOKEN, 1)
    assert _handed("s.hand") == before + 1


def test_flow_limits_set_while_a_pull_waits_are_the_locks_to_apply_not_handed_past(handing_broker):
    from tidemq_broker.storage import FlowLimits

    broker = handing_broker
    waiting = InThread(lambda: pull(broker, "s.limits", 30.0, lease_token=TOKEN))
    wait_until(lambda: _open_pull(broker, "s.limits"), 10, what="the pull to wait")
    broker.storage.topics.set_topic_limits("s.limits", FlowLimits(max_running=1), clock.now())
    broker.topics.refresh()
    before = _handed("s.limits")
    [msg_id] = produce(broker, "s.limits", '"one"')
    [got] = waiting.value(10)  # its own lock took it, under the stored limit
    assert got.id == msg_id and _handed("s.limits") == before
