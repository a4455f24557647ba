"""The consumer runners against StubBroker and the in-process coordinator: drain, prefetch bound,
re-ranking mid-pull, serial order. No servers."""

from __future__ import annotations

import ast
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.servers import wait_until
from tidemq import Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.message import MessageType
from tidemq.stub import StubBroker

CLIENT = Path(__file__).resolve().parents[2] / "client/tidemq"


@pytest.fixture
def stub():
    return StubBroker()


@pytest.fixture
def coordinators():
    """``coordinators()`` makes a started coordinator sharing this test's in-process tree."""
    root = f"/test-{uuid.uuid4().hex[:8]}"
    made = []

    def make() -> LocalCoordinator:
        coordinator = LocalCoordinator(root)
        coordinator.start()
        made.append(coordinator)
        return coordinator

    yield make
    for coordinator in made:
        coordinator.stop()


@pytest.fixture
def workers(stub, coordinators):
    """``workers(specs, instance)`` starts a Worker on the stub with its own coordinator."""
    started = []

    def start(specs, instance: str) -> Worker:
        worker = Worker(specs, link=stub, coordinator=coordinators(), instance=instance, drain_timeout=10).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_consumer_modules_import_neither_grpc_nor_protobuf():
    for name in ("queue_runner", "due", "batch", "topic_runner", "worker", "link", "stub"):
        tree = ast.parse((CLIENT / f"{name}.py").read_text())
        imported = set()
        for node in tree.body:  # module level only: worker.py makes a default Client lazily
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        assert not {m for m in imported if m.split(".")[0] in ("grpc", "rpc", "client", "pool")
                    or m.startswith("tidemq.rpc")}, f"{name}.py imports {sorted(imported)}"


def test_sigterm_lets_the_running_handler_finish_and_its_ack_land_before_run_returns(stub, coordinators):
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("Worker.run() sets signal handlers: this test must run in the main thread")
    started, finished = threading.Event(), []
    worker: Worker

    def handler(message) -> None:
        started.set()
        # Still running once the worker has begun to stop (stop() empties the runner list first).
        wait_until(lambda: not worker.runners, 10, what="the worker to start draining")
        finished.append(message.id)

    spec = ConsumerSpec("t.drain", MessageType.QUEUE, handler, threads=1, ttr=30, batch=1)
    worker = Worker([spec], link=stub, coordinator=coordinators(), instance="w1", drain_timeout=10)
    msg_id = stub.produce("t.drain", {"n": 1})

    def terminate() -> None:
        if started.wait(10):
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Thread(target=terminate, daemon=True)
    timer.start()
    worker.run()
    timer.join(5)
    assert finished == [msg_id]
    assert stub.status(msg_id) == "SUCCESS"  # acked before run() returned, not after
    assert stub.history[-1] == ("SUCCESS", msg_id)
    assert coordinators().consumers("t.drain") == []  # it left the topic
    assert signal.getsignal(signal.SIGTERM) is previous  # run() put the handler back


def test_prefetch_never_leases_more_than_threads_plus_batch(stub, workers):
    """At most threads + batch messages are leased and not yet handled at any time."""
    gate = threading.Event()
    runs: list[int] = []
    lock = threading.Lock()
    counts = {"leased": 0, "handled": 0, "peak": 0}
    pull = stub.pull

    def counting_pull(*args, **kwargs):
        got = pull(*args, **kwargs)
        with lock:
            counts["leased"] += len(got)
            counts["peak"] = max(counts["peak"], counts["leased"] - counts["handled"])
        return got

    def handler(message) -> None:
        gate.wait(10)
        with lock:
            runs.append(message.id)
            counts["handled"] += 1  # before the runner frees the slot: never under-counts

    stub.pull = counting_pull
    ids = [stub.produce("t.prefetch", n) for n in range(40)]
    workers([ConsumerSpec("t.prefetch", MessageType.QUEUE, handler, threads=2, ttr=30, batch=4)], "w1")
    wait_until(lambda: len(stub.ids("t.prefetch", "RUNNING")) == 6, 10, what="two running and four prefetched")
    gate.set()
    wait_until(lambda: len(stub.ids("t.prefetch", "SUCCESS")) == 40, 20, what="every message to succeed")
    assert sorted(runs) == ids
    assert counts["peak"] == 6  # two handlers + a batch of four, and never more


def test_a_waiting_pull_is_cancelled_and_given_back_when_the_rank_changes(stub, workers):
    topic = "t.rerank"
    first = workers([ConsumerSpec(topic, MessageType.QUEUE, lambda m: None, threads=1, ttr=30, batch=2)], "w1")
    node = wait_until(lambda: first.runners[0].rank[0] == 0 and first.runners[0].registration.node, 5,
                      what="the first consumer's rank")
    wait_until(lambda: any(p.consumer == node and p.outcome == "waiting" and p.total == 1 for p in stub.pulls),
               5, what="a long-poll waiting alone")
    workers([ConsumerSpec(topic, MessageType.QUEUE, lambda m: None, threads=1, ttr=30, batch=2)], "w2")
    # Well within the 10 s long-poll: only a cancelled pull explains a new one this soon.
    wait_until(lambda: any(p.consumer == node and p.total == 2 for p in stub.pulls), 5,
               what="a pull with the new total")
    mine = [p for p in stub.pulls if p.consumer == node]
    old = next(p for p in mine if p.total == 1)
    assert old.outcome == "cancelled"
    assert (old.lease_token, 0) in stub.releases  # the abandoned token was given back
    assert all(p.rank == 0 for p in mine if p.total == 2)

    ids = [stub.produce(topic, n) for n in range(10)]
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 10, 10, what="both shards consumed")
    assert {i for i in ids if stub.message(i).consumer == node} == {i for i in ids if i % 2 == 0}


def test_serial_runs_one_at_a_time_in_order_only_on_rank_zero_after_each_ack(stub, workers):
    topic = "t.serial"
    runs: list[tuple[int, int]] = []
    running, peak = [0], [0]
    lock = threading.Lock()

    def handler(message) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            runs.append((message.id, message.attempt))
        try:
            if message.id == ids[0] and message.attempt == 1:
                raise RuntimeError("fails once: its retry keeps its place at the head")
        finally:
            with lock:
                running[0] -= 1

    spec = ConsumerSpec(topic, MessageType.SERIAL_QUEUE, handler, threads=1, ttr=30, batch=1)
    top = workers([spec], "w1")
    wait_until(lambda: top.runners[0].rank == (0, 1), 5, what="the first consumer at rank 0")
    second = workers([spec], "w2")
    wait_until(lambda: second.runners[0].rank == (1, 2), 5, what="the second consumer at rank 1")
    ids = [stub.produce(topic, n, retry=[0] if n == 0 else 0) for n in range(8)]
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 8, 15, what="every serial message to succeed")
    assert runs == [(ids[0], 1), (ids[0], 2)] + [(i, 1) for i in ids[1:]]
    assert peak[0] == 1
    pulls = [p for p in stub.pulls if p.outcome != "cancelled"]
    assert {p.consumer for p in pulls} == {top.runners[0].registration.node}
    assert all(p.serial and p.running_before == 0 for p in pulls)  # asked again only after the ack


def test_messages_leased_ahead_start_at_their_effect_time_never_before(stub, workers):
    ran: dict[int, tuple[float, float]] = {}  # id: (handler start, effect_time), wall clock

    def handler(message):
        ran[message.id] = (time.time(), message.effect_time.timestamp())

    workers([ConsumerSpec("t.ahead", MessageType.QUEUE, handler, threads=2, ttr=30, batch=8, ahead=5.0)], "w1")
    wait_until(lambda: stub.pulls and stub.pulls[-1].outcome == "waiting", 10, what="the worker's long-poll")
    # Due 2 s from now and inside the 5 s window: the waiting pull takes them at once.
    ids = [stub.produce("t.ahead", i, delay=2.0 + i * 0.2) for i in range(5)]
    wait_until(lambda: len(ran) == 5, 30)
    # The handler's record comes before its ack: wait for the acks too.
    wait_until(lambda: sorted(stub.ids("t.ahead", "SUCCESS")) == ids, 10, what="every ack")
    for msg_id in ids:
        stored = stub.message(msg_id)
        assert stored.leased_at < stored.effect_time  # handed to the worker ahead of time...
        started, effect = ran[msg_id]
        assert started >= effect  # ...and started at its effect_time, never before
        assert stored.status == "SUCCESS"


def test_a_stopping_worker_still_runs_what_it_leased_ahead_at_its_time(stub, coordinators):
    ran: list[tuple[float, float]] = []
    msg_id = stub.produce("t.ahead.drain", "x", delay=3.0)
    spec = ConsumerSpec("t.ahead.drain", MessageType.QUEUE,
                        lambda m: ran.append((time.time(), m.effect_time.timestamp())), threads=1, ttr=30, batch=2,
                        ahead=5.0)
    worker = Worker([spec], link=stub, coordinator=coordinators(), instance="w1", drain_timeout=10).start()
    wait_until(lambda: stub.status(msg_id) == "RUNNING", 10)
    assert not ran  # leased, not yet due
    worker.stop()
    assert len(ran) == 1 and ran[0][0] >= ran[0][1]
    assert stub.status(msg_id) == "SUCCESS"  # run and acknowledged before stop returned
