"""Workflows at scale against real MariaDB and ZooKeeper, real brokers and real worker processes:
a chain of 100, a group of 10,000 with a chord callback, a chord of 1,000 while workers and
brokers are killed with kill -9 during its fan-in, and a random DAG of 1,000 nodes across two
brokers. Each step's
completed runs are read from the workers' handler log (``tests/workflow_runs.py``): no step
starts before its dependencies ended, the callback runs once, and nothing runs twice but what a
killed worker held."""

from __future__ import annotations

import pytest

from tests.observe import all_messages, count, success_records
from tests.processes import TIDEMQ, kill9, process_env, start_broker_process, wait_registered
from tests.servers import wait_until
from tests.workflow_runs import check_order, dag_shape, random_dag, read_runs, submit_dag, wide_chord
from tidemq import Client, chain, chord, group, sig, trace
from tidemq_broker.storages import open_storage

pytestmark = pytest.mark.slow

HANDLERS = "tests.integration.handlers_workflow"


@pytest.fixture
def workflow_env(settings, tmp_path):
    """What the workers of one test share: its log and topic (named by the test)."""
    def make(topic: str, **extra: str) -> dict:
        return process_env(settings, FAULT_LOG=str(tmp_path / "runs.log"), FAULT_TOPIC=topic, **extra)
    return make


def _workers(spawn, env: dict, count_: int, prefix: str = "worker") -> dict:
    return {f"{prefix}{i}": spawn(f"{prefix}{i}", TIDEMQ + ["worker", HANDLERS], env) for i in range(count_)}


def _succeeded(storage, topic: str, n: int, timeout: float, what: str) -> None:
    wait_until(lambda: count(storage, topic, "SUCCESS") >= n, timeout, 0.1, what)
    assert storage.counts.count_by_status(topic) == {topic: {"SUCCESS": n}}


def test_a_chain_of_100_runs_each_step_after_the_one_before(settings, broker, spawn, tmp_path, workflow_env):
    # One broker: a step released through one broker reaches pulls waiting on another only by
    # its earliest-due probe (about 0.5 s), so across two a chain of 100 takes about a minute.
    # The DAG below runs across two.
    topic = "wf.chain"
    _workers(spawn, workflow_env(topic, FAULT_TTR="30"), 2)
    client = Client(settings)
    try:
        wait_registered(client.coordinator, topic, 2)
        ids = chain(sig(topic, {"n": n}) for n in range(100)).produce(client)
        _succeeded(broker.storage, topic, 100, 60, "the chain's last step")
    finally:
        client.close()
    runs = read_runs(tmp_path / "runs.log")
    order = check_order(ids, [[]] + [[n - 1] for n in range(1, 100)], runs)
    assert (order.missing, order.early, order.duplicates) == ([], [], {})
    starts = [runs[i][0].start for i in ids]
    assert starts == sorted(starts)


def test_a_group_of_10000_runs_its_chord_callback_once_after_every_member(settings, two_brokers, spawn, tmp_path,
                                                                          workflow_env):
    topic, n = "wf.group", 10_000
    _workers(spawn, workflow_env(topic, FAULT_TTR="60", WORKFLOW_BATCH="500"), 2)
    client = Client(settings)
    storage = two_brokers[0].storage
    try:
        wait_registered(client.coordinator, topic, 2)
        # Wider than the stored messages one step may wait on (MAX_DEPENDENCIES): the callback
        # waits on every member of its own submission.
        members, callback = wide_chord(client, topic, n, topic)
        assert len(members) == n
        assert callback.result(timeout=120) is None
        _succeeded(storage, topic, n + 1, 30, "every step")
    finally:
        client.close()
    runs = read_runs(tmp_path / "runs.log")
    order = check_order(members + [callback.id], [[] for _ in members] + [list(range(n))], runs)
    assert (order.missing, order.early, order.duplicates) == ([], [], {})
    stored = storage.reads.get_message(callback.id)
    events = [e["event"] for e in trace.parse(stored.trace)]
    # Released once, by the last member's ack.
    assert (events.count("DEPENDENCY_MET"), events.count("SUCCESS"), len(runs[callback.id])) == (1, 1, 1)


def test_a_chord_of_1000_runs_its_callback_once_while_workers_and_brokers_are_killed(settings, spawn, tmp_path,
                                                                                     workflow_env):
    topic, n = "wf.chord.kills", 1000
    log = tmp_path / "runs.log"
    env = workflow_env(topic, FAULT_TTR="2", FAULT_SLEEP="0.03", WORKFLOW_BATCH="8")
    brokers = [start_broker_process(spawn, tmp_path, env, f"broker{i}")[0] for i in range(2)]
    workers = _workers(spawn, env, 3)
    client = Client(settings)
    storage = open_storage(settings.db_url)
    killed_workers: list[int] = []
    try:
        wait_registered(client.coordinator, topic, 3)
        *members, callback = chord(group(sig(topic, {"n": i}) for i in range(n)),
                                   sig(topic, {"callback": True})).produce(client)
        # Kills during the fan-in, each once the members have got that far: a worker, a
        # broker, a worker, and the other broker while the last members are acked.
        for at, victim in ((150, "worker0"), (400, "broker0"), (650, "worker1"), (980, "broker1")):
            wait_until(lambda: len(read_runs(log)) >= at, 60, 0.02, f"{at} members run")
            if victim.startswith("worker"):
                killed_workers.append(workers[victim].pid)
                kill9(workers[victim])
                workers[victim + "-again"] = spawn(victim + "-again", TIDEMQ + ["worker", HANDLERS], env)
            else:
                index = int(victim[-1])
                kill9(brokers[index])
                brokers[index] = start_broker_process(spawn, tmp_path, env, f"{victim}-again")[0]
        wait_until(lambda: count(storage, topic, "SUCCESS") == n + 1, 90, 0.1, "the callback to succeed")
        messages = {m.id: m for m in all_messages(storage, topic)}
    finally:
        client.close()
        storage.close()
    assert set(messages) == set(members) | {callback}, "a member is missing or extra"
    assert all(m.status == "SUCCESS" and success_records(m) == 1 for m in messages.values())
    runs = read_runs(log)
    order = check_order(members + [callback], [[] for _ in members] + [list(range(n))], runs)
    assert (order.missing, order.early) == ([], [])
    assert len(runs[callback]) == 1 and \
        [e["event"] for e in trace.parse(messages[callback].trace)].count("DEPENDENCY_MET") == 1
    # A member runs twice only when a killed worker held it: its lease expired, lost by that worker.
    for msg_id in order.duplicates:
        lost_by = [e.get("lost_by", "") for e in trace.parse(messages[msg_id].trace) if e["event"] == "LEASE_EXPIRED"]
        assert any(f"-{pid}-" in node for node in lost_by for pid in killed_workers), (msg_id, lost_by)
    print(f"\nchord of {n}: worker kills 2, broker kills 2, members run twice {len(order.duplicates)}")


def test_a_dag_of_1000_nodes_runs_no_step_before_its_dependencies(settings, two_brokers, spawn, tmp_path,
                                                                  workflow_env):
    topic = "wf.dag"
    deps = random_dag(1000)
    shape = dag_shape(deps)
    assert shape["roots"] >= 2 and shape["max fan-in"] >= 10 and shape["max fan-out"] >= 10, shape
    _workers(spawn, workflow_env(topic, FAULT_TTR="30"), 2)
    client = Client(settings)
    try:
        wait_registered(client.coordinator, topic, 2)
        ids = submit_dag(client, topic, deps)
        _succeeded(two_brokers[0].storage, topic, len(deps), 120, "every step of the DAG")
    finally:
        client.close()
    order = check_order(ids, deps, read_runs(tmp_path / "runs.log"))
    assert (order.missing, order.early, order.duplicates) == ([], [], {})
    print(f"\nDAG {shape}")
