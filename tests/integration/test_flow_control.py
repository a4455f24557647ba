"""Flow control against real MariaDB, ZooKeeper, a broker process and 4 worker processes: the
topic's limits hold across workers (the broker's lock enforces them, not each worker), and due
messages run higher priority first."""

from __future__ import annotations

import statistics


from tests.integration.handlers_common import read_log
from tests.observe import count
from tests.processes import start_broker_process, start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, Settings, clock
from tidemq_broker.storage import FlowLimits

WORKERS = 4



def run(topic, mysql_url, zk_hosts, spawn, tmp_path, produce, workers=WORKERS, threads=4, sleep=0.0):
    """Start a broker and ``workers`` worker processes on ``topic``, call ``produce(client)``
    (returns the ids); returns (ids, handler log, client). ``finish`` waits and closes the client."""
    log = tmp_path / f"{topic}.log"
    env = {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "HANDLER_LOG": str(log),
           "HANDLER_TOPIC": topic, "HANDLER_TTR": "30", "HANDLER_SLEEP": str(sleep), "HANDLER_THREADS": str(threads)}
    start_broker_process(spawn, tmp_path, env, "broker")
    client = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts}))
    try:
        ids = produce(client)
        for i in range(workers):
            start_worker(spawn, f"w{i}", "tests.integration.handlers_queue", env)
        wait_registered(client.coordinator, topic, workers)
    except BaseException:
        client.close()
        raise
    return ids, log, client


def most_at_once(intervals):
    """The largest number of (start, end) intervals open at one moment."""
    edges = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def finish(client, mysql_store, topic, ids, log, timeout=90):
    try:
        wait_until(lambda: count(mysql_store, topic, "SUCCESS") == len(ids), timeout, 0.2,
                   f"every message of {topic} SUCCESS")
    finally:
        client.close()
    entries = [e for e in read_log(log) if e.end is not None]
    assert sorted(e.id for e in entries) == sorted(ids)  # each ran once
    return entries


def test_running_limit_holds_across_four_workers(mysql_url, zk_hosts, spawn, tmp_path, mysql_store):
    topic = "it.flow.running"
    mysql_store.topics.set_topic_limits(topic, FlowLimits(max_running=3), clock.now())
    ids, log, client = run(topic, mysql_url, zk_hosts, spawn, tmp_path,
                           lambda c: c.produce_many(topic, list(range(90))), sleep=0.1)
    entries = finish(client, mysql_store, topic, ids, log)
    # 16 handler threads in all: without the limit far more than 3 would run at once.
    assert most_at_once([(e.start, e.end) for e in entries]) == 3
    assert len({e.pid for e in entries}) > 1


def test_per_key_limit_holds_across_four_workers(mysql_url, zk_hosts, spawn, tmp_path, mysql_store):
    topic = "it.flow.key"
    mysql_store.topics.set_topic_limits(topic, FlowLimits(max_running_per_key=2), clock.now())
    keys = [f"customer-{i % 3}" for i in range(60)]
    ids, log, client = run(topic, mysql_url, zk_hosts, spawn, tmp_path,
                           lambda c: c.produce_many(topic, list(range(60)), keys=keys), sleep=0.1)
    entries = finish(client, mysql_store, topic, ids, log)
    key_of = dict(zip(ids, keys))
    for key in set(keys):
        assert most_at_once([(e.start, e.end) for e in entries if key_of[e.id] == key]) <= 2, key
    assert most_at_once([(e.start, e.end) for e in entries]) > 2  # the keys together ran more


def test_started_rate_stays_within_a_tenth_of_the_limit(mysql_url, zk_hosts, spawn, tmp_path, mysql_store):
    topic, rate, n = "it.flow.rate", 20.0, 120
    mysql_store.topics.set_topic_limits(topic, FlowLimits(rate_per_second=rate), clock.now())
    ids, log, client = run(topic, mysql_url, zk_hosts, spawn, tmp_path,
                           lambda c: c.produce_many(topic, list(range(n))), sleep=0.01)
    finish(client, mysql_store, topic, ids, log)
    # The limit is on leases, stamped by the brokers' clock; handler starts in the workers follow
    # them, later and less evenly on a loaded machine.
    starts = sorted(mysql_store.reads.get_message(i).start_time.timestamp() for i in ids)
    # The slope of leases over time (least squares): a pull takes what accrued since the last
    # one, so leases come in clumps, and a first-to-last rate moves by a clump at either end.
    mean_t, mean_k = statistics.fmean(starts), (len(starts) - 1) / 2
    observed = (sum((t - mean_t) * (k - mean_k) for k, t in enumerate(starts))
                / sum((t - mean_t) ** 2 for t in starts))  # about 6 s at 20/s
    assert abs(observed - rate) <= 0.1 * rate, f"leased {observed:.2f}/s for a limit of {rate}/s"
    # No second anywhere leased much more than the rate: a late pull catches up what accrued
    # while it was late (at most a second's worth), so a second may hold the rate and a part of that.
    busiest = max(sum(1 for s in starts if t <= s < t + 1.0) for t in starts)
    print(f"leased {observed:.2f}/s for a limit of {rate}/s; busiest second {busiest}")
    assert busiest <= rate * 1.5


def test_due_messages_run_higher_priority_first(mysql_url, zk_hosts, spawn, tmp_path, mysql_store):
    topic = "it.flow.priority"

    def produce(client):
        low = client.produce_many(topic, list(range(20)))
        high = client.produce_many(topic, list(range(20)), priority=9)
        middle = client.produce_many(topic, list(range(20)), priority=4)
        return low + high + middle

    ids, log, client = run(topic, mysql_url, zk_hosts, spawn, tmp_path, produce, workers=1, threads=1)
    entries = finish(client, mysql_store, topic, ids, log)
    order = [e.id for e in sorted(entries, key=lambda e: e.start)]
    assert order == ids[20:40] + ids[40:60] + ids[:20]
