"""The broker's result RPCs over the memory storage: an ack stores its result, Extend stores
progress and answers cancel flags, Cancel(running) marks a running message, and Results answers
at once or long-polls until a waited message is final, woken by this broker's acks or by the
shared probe for commits it did not see."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from tests.background import InThread
from tests.servers import wait_until
from tests.unit.test_broker_service import Aborted, Context, produce, pull, stored
from tidemq import clock
from tidemq.errors import DatabaseOutOfReachError
from tidemq.rpc import tidemq_pb2 as pb
from tidemq_broker.pulls import PullHub
from tidemq_broker.results import ResultHub
from tidemq_broker.service import BrokerService
from tidemq_broker.storage import AckItem, MessageResult, TopicSettings
from tidemq_broker.storages.memory import open_memory_storage
from tidemq_broker.topics import TopicCache
from tidemq_broker.writer import GroupCommitWriter


class CountingProbes:
    """The storage's probes, keeping the ids of each of the waiters' probe calls."""

    def __init__(self, probes) -> None:
        self._probes = probes
        self.finished_calls: list[list[int]] = []

    def finished(self, ids):
        self.finished_calls.append(sorted(ids))
        return self._probes.finished(ids)

    def __getattr__(self, name):
        return getattr(self._probes, name)


@pytest.fixture
def broker():
    storage = open_memory_storage()
    topics = TopicCache(storage.topics)
    hub = PullHub(storage.probes, recheck=60)
    writer = GroupCommitWriter(storage.messages, topics, "b:1", hub.notify_commit)
    probes = CountingProbes(storage.probes)
    results = ResultHub(probes, probe_interval=0.02, recheck=60)
    hub.start()
    results.start()
    service = BrokerService(storage, topics, writer, hub, "b:1", 1024, results)
    service.counting = probes
    yield service
    results.stop()
    hub.stop()
    writer.stop()


def results(broker, *ids, wait=0.0, context=None):
    return list(broker.Results(pb.ResultsRequest(ids=list(ids), wait_seconds=wait), context or Context()).states)


def ack(broker, *items):
    return list(broker.Ack(pb.AckRequest(consumer="c1", items=list(items), topic="r.t"), Context()).outcomes)


def test_an_ack_stores_its_result_and_results_reads_it_back_with_unknown_ids_not_found(broker):
    [a, b] = produce(broker, "r.t", "1", "2", retry=0)
    [ma, mb] = pull(broker, "r.t", ttr_seconds=30)
    error = json.dumps({"type": "ValueError", "message": "bad", "traceback": "tb"})
    assert ack(broker, pb.AckItem(id=a, lease_token=ma.lease_token, success=True, result='{"sum": 3}'),
               pb.AckItem(id=b, lease_token=mb.lease_token, success=False, error="bad", result=error)) == \
        [pb.APPLIED, pb.APPLIED]
    [ra, rb, unknown] = results(broker, a, b, 10 ** 9)
    assert (ra.found, ra.status, ra.result, ra.finish_time_ms > 0) == (True, "SUCCESS", '{"sum": 3}', True)
    assert (rb.status, json.loads(rb.result)["message"]) == ("FAIL", "bad")
    assert (unknown.id, unknown.found, unknown.status) == (10 ** 9, False, "")


def test_an_ack_whose_result_is_not_json_or_too_large_is_refused_whole_and_nothing_changes(broker, monkeypatch):
    [a, b] = produce(broker, "r.t", "1", "2")
    [ma, mb] = pull(broker, "r.t", ttr_seconds=30)
    good = pb.AckItem(id=a, lease_token=ma.lease_token, success=True, result="1")
    with pytest.raises(Aborted) as bad:
        ack(broker, good, pb.AckItem(id=b, lease_token=mb.lease_token, success=True, result="{nope"))
    assert bad.value.code is grpc.StatusCode.INVALID_ARGUMENT and "a result must be JSON text" in bad.value.details
    monkeypatch.setenv("TIDEMQ_MAX_RESULT_BYTES", "100")
    with pytest.raises(Aborted) as large:
        ack(broker, good, pb.AckItem(id=b, lease_token=mb.lease_token, success=True, result=json.dumps("x" * 200)))
    assert large.value.error == "ResultTooLargeError" and "202 bytes" in large.value.details
    assert "the limit is 100 bytes" in large.value.details
    assert {stored(broker, i).status for i in (a, b)} == {"RUNNING"}


def test_a_waiter_is_woken_by_this_brokers_ack_without_the_probe(broker):
    [a] = produce(broker, "r.t", "1")
    [m] = pull(broker, "r.t", ttr_seconds=30)
    broker.results._probe_interval = 3600.0  # only the ack's notification can wake it (recheck: 60 s)
    waiting = InThread(lambda: results(broker, a, wait=30))
    wait_until(lambda: a in broker.results._waiters, timeout=10)
    ack(broker, pb.AckItem(id=a, lease_token=m.lease_token, success=True, result='"done"'))
    [state] = waiting.value(timeout=10)
    assert (state.status, state.result) == ("SUCCESS", '"done"')


def test_many_waiters_share_one_probe_that_sees_a_commit_made_elsewhere(broker):
    ids = produce(broker, "r.t", *[str(i) for i in range(5)])
    leased = pull(broker, "r.t", ttr_seconds=30)
    threads = [InThread(lambda i=i: results(broker, i, wait=30)) for i in ids for _ in range(4)]
    wait_until(lambda: len(broker.results._waiters) == len(ids) and
               sum(len(w) for w in broker.results._waiters.values()) == len(threads), timeout=10)
    # 20 waiters of 5 ids: each probe is one call for all five ids.
    wait_until(lambda: sorted(ids) in broker.counting.finished_calls, timeout=10)
    # Another broker's ack: straight to the storage, no notification here.
    broker.storage.acks.ack([AckItem(m.id, m.lease_token, True, result=str(m.id)) for m in leased], clock.now(),
                            "c9", "b:9", TopicSettings)
    states = [thread.value(timeout=10) for thread in threads]
    assert {(s.id, s.status, s.result) for [s] in states} == {(i, "SUCCESS", str(i)) for i in ids}


def test_a_wait_ends_at_its_deadline_with_the_current_state(broker):
    [a] = produce(broker, "r.t", "1")
    started = time.monotonic()
    [state] = results(broker, a, wait=0.3)
    assert state.status == "NEW" and time.monotonic() - started >= 0.3


def test_extend_stores_progress_under_the_lease_and_answers_cancel_flags(broker):
    [a, b] = produce(broker, "r.t", "1", "2")
    [ma, mb] = pull(broker, "r.t", ttr_seconds=30)
    leases = [pb.LeaseRef(id=a, lease_token=ma.lease_token), pb.LeaseRef(id=b, lease_token=mb.lease_token)]
    progress = [pb.ProgressReport(id=a, lease_token=ma.lease_token, done=3, total=10, has_total=True, note="rows")]
    reply = broker.Extend(pb.ExtendRequest(leases=leases, ttr_seconds=30, progress=progress), Context())
    assert list(reply.extended) == [True, True] and list(reply.cancel_requested) == [False, False]
    [state] = results(broker, a)
    report = json.loads(state.progress)
    assert (report["done"], report["total"], report["note"]) == (3, 10, "rows") and report["at"] > 0
    cancelled = broker.Cancel(pb.CancelRequest(ids=[b], running=True), Context())
    assert list(cancelled.cancelled) == [True]
    reply = broker.Extend(pb.ExtendRequest(leases=leases, ttr_seconds=30), Context())
    assert list(reply.cancel_requested) == [False, True]
    assert stored(broker, b).status == "RUNNING" and stored(broker, b).cancel_requested


def test_cancel_without_running_leaves_a_running_message_alone_and_deletes_a_new_one(broker):
    [a, b] = produce(broker, "r.t", "1", "2")
    pull(broker, "r.t", ttr_seconds=30, max_messages=1)
    assert list(broker.Cancel(pb.CancelRequest(ids=[a, b]), Context()).cancelled) == [False, True]
    assert not stored(broker, a).cancel_requested and stored(broker, b) is None
    [gone] = results(broker, b, wait=5)
    assert gone.found is False


def test_progress_with_a_number_that_is_not_finite_is_refused(broker):
    [a] = produce(broker, "r.t", "1")
    [m] = pull(broker, "r.t", ttr_seconds=30)
    bad = [pb.ProgressReport(id=a, lease_token=m.lease_token, done=float("nan"))]
    with pytest.raises(Aborted) as refused:
        broker.Extend(pb.ExtendRequest(leases=[pb.LeaseRef(id=a, lease_token=m.lease_token)], ttr_seconds=30,
                                       progress=bad), Context())
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT and "finite number" in refused.value.details


def test_results_refuses_more_ids_than_its_limit_and_a_bad_wait(broker):
    with pytest.raises(Aborted, match="the limit is 1000 per call"):
        results(broker, *range(1, 1002))
    with pytest.raises(Aborted, match="wait_seconds must be between 0 and 60"):
        results(broker, 1, wait=61)


def test_the_result_probe_looks_quicker_while_it_finds_ends_and_slows_down_after():
    """Waiters here, acks through another broker (here: a probe that reports an end now and
    then): once a probe finds ends the next come at the busy interval; without ends, at the
    idle one again."""
    probes: list[float] = []
    ending = {"on": False}

    class Probes:
        def finished(self, ids):
            probes.append(time.monotonic())
            return list(ids[:1]) if ending["on"] else []

    hub = ResultHub(Probes(), probe_interval=0.5, recheck=60, busy_interval=0.01)  # type: ignore[arg-type]
    hub.start()
    running = [MessageResult(1, "t.probe", "RUNNING", None, None, clock.now(), None)]
    waiter = InThread(hub.wait, [1], time.monotonic() + 60, lambda ids: running)  # never final: waits on
    try:
        wait_until(lambda: len(probes) >= 2, 10, what="the first probes")
        ending["on"] = True
        busy_from = len(probes)
        # 20 more probes within 2 s: at the idle interval (0.5 s) there would be 4.
        wait_until(lambda: len(probes) >= busy_from + 20, 2.5, 0.005, what="20 probes while ends are found")
        ending["on"] = False
        # Without ends for a second the probe goes back to the idle interval: a gap of 0.3 s.
        wait_until(lambda: time.monotonic() - probes[-1] > 0.3, 10, 0.01, what="the probes to slow down")
    finally:
        hub.stop()
        waiter.join(5)
    assert waiter.error is None


def test_the_probe_leaves_out_ids_whose_waiters_this_broker_already_woke():
    """An end this broker recorded woke its waiters, which read the message again themselves:
    the shared probe does not ask for it, nor count it as an end found (which would make the
    next probes come at the busy interval); another waited id is still probed."""
    asked: list[list[int]] = []

    class Probes:
        def finished(self, ids):
            asked.append(sorted(ids))
            return []

    hub = ResultHub(Probes(), probe_interval=0.01, recheck=60, busy_interval=0.01)  # type: ignore[arg-type]
    hub._register([1])  # two waiters of their own, as Results calls register (never woken by a read here)
    hub._register([2])
    assert hub.notify([1]) == 1  # this broker recorded the end of 1: its waiter woke
    assert hub.notify([1]) == 0  # already awake: nothing new
    hub.start()
    try:
        wait_until(lambda: len(asked) >= 5, 10, 0.005, what="five probes")
    finally:
        hub.stop()
    assert asked[:5] == [[2]] * 5


def test_a_waiter_that_ends_an_idle_time_is_first_probed_one_interval_later():
    """It read its messages as it registered: a probe at once would read them again."""
    asked: list[tuple[float, list[int]]] = []

    class Probes:
        def finished(self, ids):
            asked.append((time.monotonic(), sorted(ids)))
            return []

    hub = ResultHub(Probes(), probe_interval=0.3, recheck=60, busy_interval=0.3)  # type: ignore[arg-type]
    hub.start()
    try:
        registered = time.monotonic()
        hub._register([7])
        wait_until(lambda: asked, 10, 0.005, what="the first probe")
    finally:
        hub.stop()
    [(at, ids)] = asked[:1]
    assert ids == [7] and at - registered >= 0.3


def test_a_database_out_of_this_brokers_reach_wakes_every_waiter_whose_read_then_fails():
    """Another broker may reach the database: the waiters here must not sleep until their
    deadline (or recheck). Once the probe finds it out of reach, each waiter reads again, and
    the failure ends its Results call (UNAVAILABLE, which moves the caller's call elsewhere)."""
    reach = {"out": False}

    class Probes:
        def finished(self, ids):
            if reach["out"]:
                raise DatabaseOutOfReachError("no answer from the database")
            return []

    def read(ids):
        if reach["out"]:
            raise DatabaseOutOfReachError("no answer from the database")
        return [MessageResult(id, "t.reach", "RUNNING", None, None, clock.now(), None) for id in ids]

    hub = ResultHub(Probes(), probe_interval=0.01, recheck=60)  # type: ignore[arg-type]
    hub.start()
    try:
        waiters = [InThread(hub.wait, [id], time.monotonic() + 60, read) for id in (1, 2, 2)]
        wait_until(lambda: len(hub._waiters) == 2 and len(hub._waiters[2]) == 2, 10, 0.005, what="three waiters")
        assert all(waiter.is_alive() for waiter in waiters)
        reach["out"] = True
        for waiter in waiters:
            assert isinstance(waiter.outcome(5), DatabaseOutOfReachError)
    finally:
        hub.stop()
