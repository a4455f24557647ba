"""Coalescing of concurrent calls (tidemq.coalesce) and the client's shared Produce RPCs.

The flush functions here hold each call on an event, so requests pile up behind busy slots
deterministically; no sleeps, no servers.
"""

from __future__ import annotations

import collections
import threading

import pytest

from tests.background import InThread
from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq.coalesce import Coalescer
from tidemq.errors import BrokerUnavailableError, DataTooLargeError, StorageUnavailableError, TidemqError


class Held:
    """A flush function that records each batch and blocks until ``gate`` opens."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[list[str]] = []
        self.threads: list[str] = []
        self.entered = threading.Semaphore(0)

    def __call__(self, batch) -> None:
        self.batches.append([r.payload for r in batch])
        self.threads.append(threading.current_thread().name)
        self.entered.release()
        assert self.gate.wait(10)
        for request in batch:
            request.result = f"done:{request.payload}"


def call_in_thread(coalescer, payload, timeout=10.0, items=1) -> InThread:
    return InThread(coalescer.submit, payload, items, 0, timeout)


def _coalescer(flush, slots=1, max_items=100):
    return Coalescer(flush, slots, max_items, 1 << 20, lambda t: BrokerUnavailableError(f"not sent within {t}"))


def test_a_lone_request_is_flushed_at_once_in_the_callers_own_thread():
    flush = Held()
    flush.gate.set()
    assert _coalescer(flush).submit("a") == "done:a"
    assert flush.batches == [["a"]] and flush.threads == [threading.current_thread().name]


def test_requests_queued_behind_a_busy_slot_share_the_next_flush_in_arrival_order():
    flush = Held()
    coalescer = _coalescer(flush)
    first = call_in_thread(coalescer, "first")
    assert flush.entered.acquire(timeout=10)
    queued = []
    for n in range(5):
        queued.append(call_in_thread(coalescer, f"q{n}"))
        wait_until(lambda: len(coalescer._pending) == n + 1, 10)  # arrival order is queue order
    assert all(c.is_alive() for c in queued)  # nobody is answered before their flush
    flush.gate.set()
    assert first.outcome() == "done:first"
    assert [c.outcome() for c in queued] == [f"done:q{n}" for n in range(5)]
    assert flush.batches == [["first"], [f"q{n}" for n in range(5)]]
    assert coalescer.flushes == 2 and coalescer.requests == 6


class CountingLock:
    """The coalescer's lock, counting the times each thread takes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken: collections.Counter[int] = collections.Counter()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.taken[threading.get_ident()] += 1
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_callers_answered_by_another_callers_flush_return_without_taking_the_lock_again():
    # Woken on a Condition of the coalescer's lock, each caller of a flush of 64 would take that
    # lock again in turn, only to see it was done: a convoy through one lock after every flush.
    flush = Held()
    coalescer = _coalescer(flush)
    lock = coalescer._lock = CountingLock()
    first = call_in_thread(coalescer, "first")
    assert flush.entered.acquire(timeout=10)
    queued = []
    for n in range(4):
        queued.append(call_in_thread(coalescer, f"q{n}"))
        wait_until(lambda: len(coalescer._pending) == n + 1, 10)
    flush.gate.set()
    assert [c.outcome() for c in queued] == [f"done:q{n}" for n in range(4)]
    assert first.outcome() == "done:first"
    assert flush.batches == [["first"], ["q0", "q1", "q2", "q3"]]
    # q0, heading the queue, is woken when the slot frees and flushes all four (in, woken,
    # after its flush); the others are answered by it and only ever took the lock to queue.
    assert [lock.taken[c.ident] for c in queued] == [3, 1, 1, 1]


def test_a_flush_takes_no_more_than_its_item_limit_and_the_rest_follows():
    flush = Held()
    coalescer = _coalescer(flush, max_items=5)
    first = call_in_thread(coalescer, "first")
    assert flush.entered.acquire(timeout=10)
    a = call_in_thread(coalescer, "a", items=3)
    wait_until(lambda: len(coalescer._pending) == 1, 10)
    b = call_in_thread(coalescer, "b", items=3)
    wait_until(lambda: len(coalescer._pending) == 2, 10)
    flush.gate.set()
    assert [first.outcome(), a.outcome(), b.outcome()] == ["done:first", "done:a", "done:b"]
    assert flush.batches == [["first"], ["a"], ["b"]]  # 3 + 3 items would exceed 5


def test_a_request_still_queued_at_its_deadline_is_withdrawn_unsent():
    flush = Held()
    coalescer = _coalescer(flush)
    first = call_in_thread(coalescer, "first")
    assert flush.entered.acquire(timeout=10)
    late = call_in_thread(coalescer, "late", timeout=0.05)
    assert isinstance(late.outcome(), BrokerUnavailableError)
    flush.gate.set()
    assert first.outcome() == "done:first"
    assert flush.batches == [["first"]] and not coalescer._pending  # "late" never went anywhere


def test_a_huge_or_missing_timeout_waits_without_bound_instead_of_overflowing():
    flush = Held()
    coalescer = _coalescer(flush)
    first = call_in_thread(coalescer, "first")
    assert flush.entered.acquire(timeout=10)
    queued = [call_in_thread(coalescer, "huge", timeout=1e300), call_in_thread(coalescer, "none", timeout=None)]
    wait_until(lambda: len(coalescer._pending) == 2, 10)  # both wait for the slot, neither raised
    flush.gate.set()
    assert [first.outcome()] + [c.outcome() for c in queued] == ["done:first", "done:huge", "done:none"]


def test_a_failing_flush_reaches_every_caller_of_its_batch_and_the_next_batch_still_runs():
    calls = []

    def flush(batch):
        calls.append([r.payload for r in batch])
        if any(r.payload == "boom" for r in batch):
            raise RuntimeError("flush bug")
        for r in batch:
            r.result = r.payload

    coalescer = _coalescer(flush)
    with pytest.raises(RuntimeError, match="flush bug"):
        coalescer.submit("boom")
    assert coalescer.submit("fine") == "fine"


def test_a_closed_coalescer_refuses_new_requests():
    coalescer = _coalescer(Held())
    coalescer.close(lambda: StorageUnavailableError("shutting down"))
    with pytest.raises(StorageUnavailableError, match="shutting down"):
        coalescer.submit("x")


# -- the client's shared Produce RPCs ---------------------------------------------------------


class FakeBroker:
    """Stands in for BrokerPool.call("Produce", ...): stores messages, refuses 'bad' data as the
    broker does (before writing anything), and can hold calls on a gate."""

    def __init__(self) -> None:
        self.stored: list[str] = []
        self.rpcs: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        self.fail: TidemqError | None = None

    def call(self, method, request, timeout, **_kw):
        assert method == "Produce"
        self.rpcs.append(len(request.messages))
        self.entered.release()
        assert self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        if any(m.data == '"bad"' for m in request.messages):
            raise DataTooLargeError("message #1: data is too large")

        class Reply:
            ids = list(range(len(self.stored) + 1, len(self.stored) + 1 + len(request.messages)))

        self.stored.extend(m.data for m in request.messages)
        return Reply()


@pytest.fixture
def client():
    c = Client(Settings(brokers=("127.0.0.1:1",), produce_in_flight=1))
    fake = FakeBroker()
    c.pool.call = fake.call  # type: ignore[method-assign]
    c.fake = fake  # type: ignore[attr-defined]
    yield c
    c.close()


def produce_in_thread(client, data) -> InThread:
    return InThread(client.produce, "t.co", data)


def _pile_up(client, datas):
    """Hold one produce in flight, queue ``datas`` behind it, then let everything go."""
    fake = client.fake
    fake.gate.clear()
    first = produce_in_thread(client, "first")
    assert fake.entered.acquire(timeout=10)
    queued = []
    for n, data in enumerate(datas):
        queued.append(produce_in_thread(client, data))
        wait_until(lambda: len(client.producer._pending) == n + 1, 10)
    fake.gate.set()
    for p in [first, *queued]:
        p.join(10)
    return first, queued


def test_concurrent_produce_calls_share_one_rpc_and_each_gets_its_own_id(client):
    first, queued = _pile_up(client, [f"m{n}" for n in range(8)])
    assert client.fake.rpcs == [1, 8]
    assert [client.fake.stored[p.result - 1] for p in [first, *queued]] == \
        [f'"{d}"' for d in ["first"] + [f"m{n}" for n in range(8)]]


def test_bad_input_in_a_shared_rpc_fails_only_its_own_caller(client):
    first, queued = _pile_up(client, ["ok1", "bad", "ok2"])
    good = [queued[0], queued[2]]
    assert isinstance(queued[1].error, DataTooLargeError) and queued[1].result is None
    assert all(p.error is None for p in [first, *good])
    assert sorted(client.fake.stored) == sorted(['"first"', '"ok1"', '"ok2"'])  # nothing of "bad", once each
    assert [client.fake.stored[p.result - 1] for p in good] == ['"ok1"', '"ok2"']
    assert client.fake.rpcs == [1, 3, 1, 1, 1]  # the shared one was refused whole, then one each


def test_an_unavailable_broker_reaches_every_caller_of_the_shared_rpc(client):
    client.fake.fail = StorageUnavailableError("the database is unavailable")
    first, queued = _pile_up(client, ["a", "b"])
    errors = [p.error for p in [first, *queued]]
    assert all(isinstance(e, StorageUnavailableError) for e in errors)
    assert errors[1] is not errors[2]  # each caller raises its own exception object
    assert client.fake.stored == [] and client.fake.rpcs == [1, 2]  # no retry that could store twice
