"""Results, progress and cancelling running work against real MariaDB and ZooKeeper, real
brokers and real worker processes: a waiter on another broker than the ack, results at the size
limit and over it, cancels during a run (threaded and async handlers; through another broker,
of a handler that reports nothing, told by the topic's cancel signal), a cancel racing
completion, a worker killed during a cancel, a late ack after CANCELLED, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from typing import Callable

import pytest

from tests.background import InThread
from tests.processes import TIDEMQ, kill9, process_env, start_broker_process, start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, Settings, clock
from tidemq.errors import MessageCancelledError, MessageNotFoundError, RemoteError
from tidemq.lifecycle import MessageStatus
from tidemq.link import AckItem, AckOutcome, LeaseRef
from tidemq.limits import DEFAULT_MAX_RESULT_BYTES

MODULE = "tests.integration.handlers_results"


def starts(log) -> Counter:
    """How many times each message id started a handler."""
    if not log.exists():
        return Counter()
    return Counter(int(line.split()[0]) for line in log.read_text().splitlines() if line)


@pytest.fixture
def worker_env(settings, tmp_path):
    return process_env(settings, RESULTS_LOG=str(tmp_path / "starts.log"), RESULTS_TTR="2")


def only(broker, settings) -> Client:
    """A client that calls ``broker`` and no other."""
    return Client(Settings.from_env({}, brokers=broker.address, zk_hosts=settings.zk_hosts))


def test_a_waiter_on_another_broker_gets_the_result_the_other_broker_stored(settings, two_brokers, worker_env,
                                                                            spawn, tmp_path):
    acking, waiting = two_brokers
    worker = start_worker(spawn, "w1", MODULE, {**worker_env, "TIDEMQ_BROKERS": acking.address})
    producer, waiter = only(acking, settings), only(waiting, settings)
    try:
        wait_registered(producer.coordinator, "results.sync", 1)
        handles = producer.produce_many("results.sync", [{"kind": "value", "v": n} for n in range(5)], result=True)
        for n, handle in enumerate(handles):
            value = waiter.handle(handle.id).result(timeout=60)
            assert value == {"echo": n, "pid": worker.pid}
        stored = acking.storage.reads.get_message(handles[0].id)
        assert stored.status == "SUCCESS" and json.loads(stored.result)["echo"] == 0
        assert f"broker={acking.address}" in stored.trace.splitlines()[-1]
    finally:
        producer.close()
        waiter.close()


def test_a_waiter_whose_broker_is_killed_gets_the_result_through_another_broker(settings, worker_env, spawn,
                                                                             tmp_path):
    env = process_env(settings)
    doomed, address_a = start_broker_process(spawn, tmp_path, env, name="broker-a")
    _, address_b = start_broker_process(spawn, tmp_path, env, name="broker-b")
    start_worker(spawn, "w1", MODULE, {**worker_env, "TIDEMQ_BROKERS": address_b})
    waiter = Client(Settings.from_env({}, brokers=f"{address_a},{address_b}", zk_hosts=settings.zk_hosts))
    gate = tmp_path / "gate"
    try:
        wait_registered(waiter.coordinator, "results.sync", 1)
        handle = waiter.produce("results.sync", {"kind": "gate", "path": str(gate)}, result=True)
        wait_until(lambda: handle.status() is MessageStatus.RUNNING, 60, what="the handler to start")
        waiting = InThread(lambda: handle.result(timeout=90))
        kill9(doomed)  # one of the two brokers the waiter calls dies while it waits (or before)
        gate.touch()
        assert waiting.value(timeout=120) == {"gate": "open"}
        assert handle.status() is MessageStatus.SUCCESS
    finally:
        waiter.close()


def test_a_result_at_the_size_limit_is_stored_whole_and_one_byte_over_fails_naming_the_limit(client, worker_env,
                                                                                             spawn):
    start_worker(spawn, "w1", MODULE, worker_env)
    wait_registered(client.coordinator, "results.sync", 1)
    at_limit, over = client.produce_many("results.sync", [{"kind": "sized", "bytes": DEFAULT_MAX_RESULT_BYTES},
                                                          {"kind": "sized", "bytes": DEFAULT_MAX_RESULT_BYTES + 1}],
                                         retry=0, result=True)
    value = at_limit.result(timeout=60)
    assert len(json.dumps(value)) == DEFAULT_MAX_RESULT_BYTES and set(value) == {"x"}
    with pytest.raises(RemoteError) as info:
        over.result(timeout=60)
    assert info.value.type == "tidemq.errors.ResultTooLargeError"
    assert f"{DEFAULT_MAX_RESULT_BYTES + 1} bytes" in info.value.message
    assert f"the limit is {DEFAULT_MAX_RESULT_BYTES} bytes" in info.value.message


def test_bad_input_a_return_value_that_is_not_json_fails_the_attempt_and_an_unknown_id_is_named(client, worker_env,
                                                                                                spawn):
    start_worker(spawn, "w1", MODULE, worker_env)
    wait_registered(client.coordinator, "results.sync", 1)
    not_json, raising = client.produce_many("results.sync", [{"kind": "not_json"}, {"kind": "raise", "v": 7}],
                                            retry=0, result=True)
    with pytest.raises(RemoteError) as info:
        not_json.result(timeout=60)
    assert info.value.type == "tidemq.errors.InvalidResultError" and "JSON-serialisable" in info.value.message
    with pytest.raises(RemoteError) as raised:
        raising.result(timeout=60)
    assert (raised.value.type, raised.value.message) == ("LookupError", "nothing for 7")
    assert "raise LookupError" in raised.value.traceback
    with pytest.raises(MessageNotFoundError, match=f"message {10 ** 12} is not stored"):
        client.handle(10 ** 12).result(timeout=5)


@pytest.mark.parametrize("topic, data", [("results.sync", {"kind": "until_cancelled"}), ("results.async", {})],
                         ids=["threads", "async"])
def test_a_cancel_stops_a_running_handler_and_the_message_ends_cancelled(client, worker_env, spawn, tmp_path,
                                                                         topic, data):
    start_worker(spawn, "w1", MODULE, worker_env)
    wait_registered(client.coordinator, topic, 1)
    handle = client.produce(topic, data, result=True)
    wait_until(lambda: handle.progress() is not None, 60, what="the handler's first progress report")
    assert handle.status() is MessageStatus.RUNNING
    assert handle.cancel(running=True) is True
    with pytest.raises(MessageCancelledError):
        handle.result(timeout=60)
    assert handle.status() is MessageStatus.CANCELLED
    assert starts(tmp_path / "starts.log")[handle.id] == 1


def test_a_cancel_through_another_broker_reaches_a_handler_that_reports_nothing_before_its_next_heartbeat(
        settings, two_brokers, worker_env, spawn, tmp_path):
    # The worker calls broker A only; the cancel goes through broker B. The handler reports no
    # progress, and its lease's next heartbeat comes 100 s after its start (ttr 300 s): only the
    # cancel signal of its topic, through ZooKeeper, can tell it within the wait below.
    pulled, other = two_brokers
    start_worker(spawn, "w1", MODULE, {**worker_env, "TIDEMQ_BROKERS": pulled.address})
    canceller = only(other, settings)
    try:
        wait_registered(canceller.coordinator, "results.quiet", 1)
        handle = canceller.produce("results.quiet", {}, result=True)
        wait_until(lambda: handle.id in starts(tmp_path / "starts.log"), 60, what="the handler's start")
        # Its lease extended by the ttr (the beat that follows a held message's start): no
        # heartbeat is due before 100 s from now on.
        wait_until(lambda: (pulled.storage.reads.get_message(handle.id).lease_expire - clock.now()).total_seconds()
                   > 200, 30, what="the lease extended by ttr")
        assert handle.cancel(running=True) is True
        with pytest.raises(MessageCancelledError):
            handle.result(timeout=30)
        assert handle.status() is MessageStatus.CANCELLED
        assert starts(tmp_path / "starts.log")[handle.id] == 1
    finally:
        canceller.close()


def test_a_cancel_racing_completion_ends_each_message_either_done_or_cancelled_once(client, worker_env, spawn,
                                                                                    tmp_path):
    start_worker(spawn, "w1", MODULE, worker_env)
    wait_registered(client.coordinator, "results.sync", 1)
    handles = client.produce_many("results.sync", [{"kind": "quick", "sleep": 0.02 * (n % 40)} for n in range(40)],
                                  result=True)
    log = tmp_path / "starts.log"
    cancelled = {}
    for handle in handles:
        wait_until(lambda: handle.id in starts(log) or handle.status() is not MessageStatus.NEW, 60,
                   what="the message to start")
        cancelled[handle.id] = handle.cancel(running=True)
    outcomes = Counter()
    for handle in handles:
        try:
            assert handle.result(timeout=60) == "finished"
            outcomes["done"] += 1
            assert handle.status() is MessageStatus.SUCCESS
        except MessageCancelledError:
            outcomes["cancelled"] += 1
            assert handle.status() is MessageStatus.CANCELLED and cancelled[handle.id]
    assert sum(outcomes.values()) == len(handles)
    assert all(n == 1 for i, n in starts(log).items() if i in cancelled)
    print(f"\ncancel racing completion: {dict(outcomes)}")


def test_a_worker_killed_during_a_cancel_leaves_the_message_cancelled_and_it_never_runs_again(client, worker_env,
                                                                                              spawn, tmp_path):
    first = start_worker(spawn, "w1", MODULE, worker_env)
    wait_registered(client.coordinator, "results.sync", 1)
    handle = client.produce("results.sync", {"kind": "hang"}, result=True)
    log = tmp_path / "starts.log"
    wait_until(lambda: starts(log)[handle.id] == 1, 60, what="the handler to start")
    assert handle.cancel(running=True) is True
    kill9(first)  # the handler ignores its cancel: it dies with its worker
    with pytest.raises(MessageCancelledError):
        handle.result(timeout=60)  # the leader's lease expiry ends it CANCELLED
    start_worker(spawn, "w2", MODULE, worker_env)
    wait_registered(client.coordinator, "results.sync", 1)
    marker = client.produce("results.sync", {"kind": "value", "v": "after"}, result=True)
    assert marker.result(timeout=60)["echo"] == "after"  # the new worker runs what is due
    assert starts(log)[handle.id] == 1 and handle.status() is MessageStatus.CANCELLED


def test_a_late_ack_after_cancelled_is_refused_and_changes_nothing(client, broker):
    handle = client.produce("results.manual", {"n": 1}, result=True)
    [d] = client.pull("results.manual", "manual-consumer", wait=5, ttr=30)
    assert handle.cancel(running=True) is True
    beat = client.heartbeat([LeaseRef(d.id, d.lease_token)], 30, "manual-consumer")
    assert beat.cancel_requested == [True]
    stop = AckItem(d.id, d.lease_token, False, "cancelled", cancelled=True)
    assert client.ack("results.manual", "manual-consumer", [stop]) == [AckOutcome.APPLIED]
    before = broker.storage.reads.get_message(d.id)
    late = AckItem(d.id, d.lease_token, True, result='"revived?"')
    assert client.ack("results.manual", "manual-consumer", [late]) == [AckOutcome.STALE]
    after = broker.storage.reads.get_message(d.id)
    assert (after.status, after.version, after.result) == ("CANCELLED", before.version, None)
    with pytest.raises(MessageCancelledError):
        handle.result(timeout=5)


def _command(settings: Settings, name: str) -> Callable[..., subprocess.CompletedProcess]:
    """``tidemq NAME ARGS...`` run against the cluster of ``settings``, its output captured."""
    env = {**os.environ, **process_env(settings)}
    return lambda *args: subprocess.run(TIDEMQ + [name, *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_result_command_prints_status_progress_and_result_with_an_exit_code_per_outcome(settings, client,
                                                                                           broker):
    result = _command(settings, "result")

    done, failed, waiting = client.produce_many("results.cli", [1, 2, 3], retry=0, result=True)
    deliveries = {d.id: d for d in client.pull("results.cli", "cli-consumer", max_messages=2, wait=5)}
    client.ack("results.cli", "cli-consumer", [
        AckItem(done.id, deliveries[done.id].lease_token, True, result='{"rows": 3}'),
        AckItem(failed.id, deliveries[failed.id].lease_token, False, "boom",
                json.dumps({"type": "ValueError", "message": "boom", "traceback": ""}))])
    ok = result(str(done.id))
    assert ok.returncode == 0 and "status: SUCCESS" in ok.stdout and '"rows": 3' in ok.stdout, ok.stderr
    bad = result(str(failed.id))
    assert bad.returncode == 1 and "status: FAIL" in bad.stdout and '"message": "boom"' in bad.stdout
    pending = result(str(waiting.id), "--wait", "0.2")
    assert pending.returncode == 5 and "status: NEW" in pending.stdout
    missing = result(str(10 ** 12))
    assert missing.returncode == 4 and f"message {10 ** 12} is not stored" in missing.stderr


def test_the_cancel_command_deletes_pending_stops_running_with_running_and_says_what_it_did_not(settings, client,
                                                                                              broker):
    cancel = _command(settings, "cancel")

    [running] = client.produce_many("results.cancel.cli", [1])
    [held] = client.pull("results.cancel.cli", "cli-consumer", max_messages=1, wait=5)
    assert held.id == running
    [pending] = client.produce_many("results.cancel.cli", [2], delay=3600)
    first = cancel(str(pending), str(running))
    assert first.returncode == 1, first.stderr
    assert f"{pending}: cancelled" in first.stdout
    assert f"{running}: not cancelled: running (--running stops it)" in first.stdout
    storage = broker.storage
    assert storage.reads.get_message(pending) is None
    assert not storage.reads.get_message(running).cancel_requested
    second = cancel("--running", str(running))
    assert second.returncode == 0 and f"{running}: cancelled" in second.stdout, second.stderr
    assert storage.reads.get_message(running).cancel_requested
    gone = cancel(str(10 ** 12))
    assert gone.returncode == 1 and "not cancelled" in gone.stdout
    bad = cancel("0")
    assert bad.returncode == 2 and "an ID must be a positive id, got 0" in bad.stderr
    workflow = cancel("--workflow", str(10 ** 12))
    assert workflow.returncode == 1 and f"workflow {10 ** 12}: 0 step(s)" in workflow.stdout
