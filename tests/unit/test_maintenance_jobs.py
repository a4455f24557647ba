"""Leader-only maintenance jobs against the SQLite store (fast) with a real Maintainer election."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest

from sqlalchemy import update

from tests.servers import wait_until
from tidemq.coordinators.local import LocalCoordinator
from tidemq import clock
from tidemq_broker.maintenance import Maintainer
from tidemq_broker.maintenance import leases as leases_job
from tidemq_broker.maintenance.leases import LeaseExpiry
from tidemq_broker.maintenance.requests import ProduceRequests
from tidemq_broker.maintenance.results import ResultRetention
from tidemq_broker.maintenance.retention import Retention
from tidemq_broker.schema import message
from tidemq_broker.storage import AckItem, LockRequest, NewRow, RequestRef, Shard, TopicSettings
from tests.sqldb import open_sql
from tidemq.errors import StorageUnavailableError


def _store(tmp_path):
    storage, db = open_sql(f"sqlite:///{tmp_path}/jobs.sqlite3")
    storage.schema.create_schema()
    return storage, db


def test_retention_deletes_successes_past_each_topics_retention_in_batches(tmp_path):
    storage, db = _store(tmp_path)
    now = clock.now()
    storage.topics.save_topic(TopicSettings("keep.forever", retention_days=0), now)
    storage.topics.save_topic(TopicSettings("short", retention_days=1), now)
    storage.topics.save_topic(TopicSettings("archived", retention_days=1, archive=True), now)
    for topic in ("keep.forever", "short", "archived"):
        storage.messages.insert_messages([NewRow(topic, "1", now, 0) for _ in range(25)], now)
        done = storage.leases.lock_batch(LockRequest(Shard(topic), "c", 30, now, limit=25))
        storage.acks.ack([AckItem(m.id, m.lease_token, i % 5 != 0) for i, m in enumerate(done)], now, "c", "b",
                    TopicSettings)
    # Age every finished message by two days (tests may write the table; the product may not).
    with db.engine.begin() as conn:
        conn.execute(update(message).values(finish_time=now - timedelta(days=2)))
    deleted = Retention(storage.topics, storage.messages, batch=7).run()
    counts = storage.counts.count_by_status()
    assert deleted == 20
    assert counts["short"] == {"FAIL": 5}  # dead letters are kept for an operator
    assert counts["keep.forever"] == {"SUCCESS": 20, "FAIL": 5}
    assert counts["archived"] == {"SUCCESS": 20, "FAIL": 5}  # the archive pipeline owns its history
    storage.close()


def test_result_retention_clears_results_past_each_topics_setting_in_batches_and_keeps_the_rows(tmp_path):
    storage, db = _store(tmp_path)
    now = clock.now()
    storage.topics.save_topic(TopicSettings("results.hour", result_retention_seconds=3600), now)
    storage.topics.save_topic(TopicSettings("results.default"), now)
    for topic in ("results.hour", "results.default"):
        storage.messages.insert_messages([NewRow(topic, "1", now, 0) for _ in range(10)], now)
        done = storage.leases.lock_batch(LockRequest(Shard(topic), "c", 30, now, limit=10))
        storage.acks.ack([AckItem(m.id, m.lease_token, True, result=f'{{"n": {m.id}}}') for m in done], now, "c", "b",
                         TopicSettings)
    # Two hours old: past the hour, within the default day.
    with db.engine.begin() as conn:
        conn.execute(update(message).values(finish_time=now - timedelta(hours=2)))
    assert ResultRetention(storage.topics, storage.messages, batch=3).run() == 10
    kept = {t: [r.result for r in storage.reads.get_results(range(1, 21)) if r.topic == t]
            for t in ("results.hour", "results.default")}
    assert kept["results.hour"] == [None] * 10
    assert all(result is not None for result in kept["results.default"]) and len(kept["results.default"]) == 10
    assert storage.counts.count_by_status()["results.hour"] == {"SUCCESS": 10}
    storage.close()


def test_request_ids_are_forgotten_after_a_day_and_not_before(tmp_path):
    storage, db = _store(tmp_path)
    now = clock.now()
    old = clock.after(now, -25 * 3600)
    recent = clock.after(now, -23 * 3600)
    for when, name in [(old, f"old-{n}") for n in range(7)] + [(recent, "recent")]:
        storage.messages.insert_messages([NewRow("t.req", "1", when, 0)], when, [RequestRef(name, 0, 1)])
    assert ProduceRequests(storage.messages, hours=1, batch=3).run() == 7  # never kept under 24 h, even if asked
    # A retry of the recent call is still answered; one of a forgotten call would store again.
    [first] = storage.messages.insert_messages([NewRow("t.req", "1", now, 0)], now, [RequestRef("recent", 0, 1)])
    assert storage.counts.count_by_status("t.req") == {"t.req": {"NEW": 8}}
    storage.messages.insert_messages([NewRow("t.req", "1", now, 0)], now, [RequestRef("old-0", 0, 1)])
    assert storage.counts.count_by_status("t.req") == {"t.req": {"NEW": 9}}
    storage.close()


def test_only_the_elected_leader_runs_jobs_and_a_successor_takes_over(tmp_path):
    storage, db = _store(tmp_path)
    now = clock.now()
    storage.messages.insert_messages([NewRow("t", "1", now, 0) for _ in range(3)], now)
    storage.leases.lock_batch(LockRequest(Shard("t"), "gone-consumer", 1, now, limit=3))
    woken = threading.Event()
    coordinators = [LocalCoordinator("/jobs"), LocalCoordinator("/jobs")]
    maintainers = [Maintainer(c, f"broker-{i}", [LeaseExpiry(storage.leases, f"broker-{i}", lambda topics: woken.set(),
                                                             lambda topic: 10, interval=0.05)], tick=0.02)
                   for i, c in enumerate(coordinators)]
    for m in maintainers:
        m.start()
    try:
        wait_until(lambda: sum(m.is_leader.is_set() for m in maintainers) == 1, 10, what="one leader")
        leader = next(m for m in maintainers if m.is_leader.is_set())
        wait_until(woken.is_set, 10, what="expired leases returned to NEW")
        assert storage.counts.count_by_status("t") == {"t": {"NEW": 3}}
        assert "lost_by=gone-consumer" in storage.reads.get_message(1).trace
        leader.stop()
        other = next(m for m in maintainers if m is not leader)
        wait_until(other.is_leader.is_set, 10, what="the other broker to take over")
    finally:
        for m in maintainers:
            m.stop()
        storage.close()


class _Flaky:
    """The storage's leases, with lease expiry failing as it does while the database is away."""

    def __init__(self, leases) -> None:
        self.leases, self.away = leases, False

    def expire_leases(self, *args, **kwargs):
        if self.away:
            raise StorageUnavailableError("the database is unavailable (test)")
        return self.leases.expire_leases(*args, **kwargs)


def test_lease_expiry_gives_leases_that_ran_out_during_an_outage_their_ttr_after_it(tmp_path, monkeypatch):
    storage, db = _store(tmp_path)
    start = clock.now()
    moments = iter([0, 1, 3, 20, 21, 22.5, 40, 41])  # seconds after start, one per run
    monkeypatch.setattr(leases_job, "clock", SimpleNamespace(now=lambda: clock.after(start, next(moments))))
    due = clock.after(start, -60)
    storage.messages.insert_messages([NewRow("t.grace", "1", due, 0) for _ in range(3)], due)
    [gone] = storage.leases.lock_batch(LockRequest(Shard("t.grace"), "dead", 2, clock.after(start, -5),
                                                   limit=1))  # ran out before
    [quick] = storage.leases.lock_batch(LockRequest(Shard("t.grace"), "c", 2, start,
                                                    limit=1))  # runs out at +2, in the outage
    [slow] = storage.leases.lock_batch(LockRequest(Shard("t.grace"), "c", 15, start,
                                                   limit=1))  # runs out at +15, in the outage
    flaky = _Flaky(storage.leases)
    job = LeaseExpiry(flaky, "b", lambda topics: None, lambda topic: 10)
    assert job.run() == 1 and storage.reads.get_message(gone.id).status == "NEW"  # +0: the database answers
    flaky.away = True
    for _ in range(2):  # +1, +3: the database is away; quick's lease runs out meanwhile
        with pytest.raises(StorageUnavailableError):
            job.run()
    flaky.away = False
    assert job.run() == 0  # +20, back: quick (ran out at +2) and slow (+15) are held for their ttr
    assert job.run() == 0  # +21: quick's 2 s after the return are not over
    assert job.run() == 1 and storage.reads.get_message(quick.id).status == "NEW"  # +22.5
    assert storage.leases.extend_leases([(slow.id, slow.lease_token)], 15, clock.after(start,
                                                                                       30)) == [True]  # a heartbeat
    assert job.run() == 0 and storage.reads.get_message(slow.id).status == "RUNNING"  # +40: extended to +45
    assert job.run() == 0  # +41
    storage.close()
