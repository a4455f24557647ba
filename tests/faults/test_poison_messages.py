"""A message that kills its worker every time ends in FAIL after its topic's max_deliveries,
with a trace that says why, instead of taking down every worker that picks it up forever."""

from __future__ import annotations

from tests.observe import handler_runs
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, clock, trace
from tidemq_broker.storage import TopicSettings
from tidemq_broker.storages import open_storage

TOPIC = "fault.poison"
MAX_DELIVERIES = 3


def test_a_message_that_kills_its_worker_every_time_ends_in_fail(settings, spawn, tmp_path):
    log = tmp_path / "runs.log"
    # A short session lets the dead worker's node go quickly, so its replacement is alone and
    # takes every shard; ttr 1 s lets the lease run out soon after each death.
    env = process_env(settings, HANDLER_LOG=str(log), FAULT_TOPIC=TOPIC, TIDEMQ_ZK_SESSION_TIMEOUT="4")
    storage = open_storage(settings.db_url)
    storage.topics.save_topic(TopicSettings(TOPIC, max_deliveries=MAX_DELIVERIES), clock.now())
    start_broker_process(spawn, tmp_path, env)
    client = Client(settings)
    try:
        poison = client.produce(TOPIC, {"poison": True}, retry=5)
        workers = []
        deaths = 0
        while storage.reads.get_message(poison).status != "FAIL":
            assert deaths <= MAX_DELIVERIES, "the poison message was delivered past max_deliveries"
            worker = spawn(f"worker-{deaths}", TIDEMQ + ["worker", "tests.faults.handlers_poison"], env)
            workers.append(worker)
            wait_until(lambda: worker.poll() is not None or storage.reads.get_message(poison).status == "FAIL", 90,
                       what="the worker to run the poison message (and die) or the message to fail")
            if worker.poll() is not None:
                assert worker.returncode == 17  # it died of the poison, not of something else
                deaths += 1
                wait_until(lambda: not client.coordinator.consumers(TOPIC), 60, what="the dead worker's node to go")
        dead = storage.reads.get_message(poison)
        assert deaths == MAX_DELIVERIES and dead.attempt == MAX_DELIVERIES
        assert dead.retry_remaining == 5  # deaths are not handler failures: the retries were never used
        events = trace.parse(dead.trace)
        assert [e["event"] for e in events].count("LEASE_EXPIRED") == MAX_DELIVERIES - 1
        assert events[-1]["event"] == "FAIL"
        assert events[-1]["error"] == f"lease_expired_{MAX_DELIVERIES}_times:_max_deliveries_{MAX_DELIVERIES}_reached"
        assert handler_runs(log)[poison] == MAX_DELIVERIES
        # The dead letter no longer takes workers down: messages produced now all run, once each,
        # on a worker that stays alive. (Produced while the poison still circulated, a message a
        # dying worker had prefetched would have spent a delivery with it each time: max_deliveries
        # counts every delivery, as SQS's receive count and RabbitMQ's delivery limit do.)
        healthy = client.produce_many(TOPIC, [{"n": n} for n in range(5)])
        survivor = spawn("worker-last", TIDEMQ + ["worker", "tests.faults.handlers_poison"], env)
        wait_until(lambda: all(storage.reads.get_message(i).status == "SUCCESS" for i in healthy), 60,
                   what="the healthy messages to succeed")
        assert survivor.poll() is None
        assert all(storage.reads.get_message(i).attempt == 1 for i in healthy)
        # The dead letter is requeued like any other.
        assert client.requeue([poison]) == 1 and storage.reads.get_message(poison).status in ("NEW", "RUNNING")
    finally:
        client.close()
        storage.close()
