"""The storage conformance suite, continued (see test_storage.py): acks, leases and their expiry,
requeue, the serial lock, probes, retention, topic settings, listing and counts, on every storage."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conformance.storage_ops import ack, insert, lock, settings
from tests.observe import list_messages
from tidemq.errors import StorageUnavailableError
from tidemq import clock, trace
from tidemq_broker.storage import (AckItem, AckOutcome, LockRequest, MessageFilter, NewRow, OutageGrace, Shard,
                                   TopicSettings)
from tidemq_broker.storages import open_storage


@pytest.fixture
def storage(any_storage):
    return any_storage


def test_ack_success_is_applied_once_and_stale_tokens_are_refused(storage):
    [msg_id] = insert(storage, "t.ack", 1)
    [msg] = lock(storage, "t.ack")
    assert ack(storage, [AckItem(msg_id, "wrong-token", True)]) == [AckOutcome.STALE]
    assert ack(storage, [AckItem(msg_id, msg.lease_token, True)]) == [AckOutcome.APPLIED]
    stored = storage.reads.get_message(msg_id)
    # The same ack again (its reply was lost with a connection) is answered as recorded and
    # changes nothing; another outcome under that lease, or another lease's, is refused.
    assert ack(storage, [AckItem(msg_id, msg.lease_token, True)]) == [AckOutcome.APPLIED]
    assert ack(storage, [AckItem(msg_id, msg.lease_token, False, "late")]) == [AckOutcome.STALE]
    assert ack(storage, [AckItem(msg_id, "wrong-token", True)]) == [AckOutcome.STALE]
    again = storage.reads.get_message(msg_id)
    assert again.status == "SUCCESS" and again.finish_time is not None
    assert again.trace.count("SUCCESS") == 1 and (again.version, again.trace) == (stored.version, stored.trace)


@pytest.mark.parametrize("stale", [False, True])
def test_an_acks_committed_call_comes_once_after_its_outcomes_are_stored(storage, stale):
    # The broker wakes its result waiters there: they must read the outcomes, never the state
    # before. With a stale item the fast path rolls back and the exact path commits instead.
    ids = insert(storage, "t.ackcommitted", 2)
    leased = sorted(lock(storage, "t.ackcommitted"), key=lambda m: m.id)
    seen = []

    def committed():
        seen.append([storage.reads.get_message(id).status for id in ids])

    items = [AckItem(leased[0].id, leased[0].lease_token, True),
             AckItem(leased[1].id, "wrong-token" if stale else leased[1].lease_token, True)]
    outcomes = storage.acks.ack(items, clock.now(), "c1", "b1", settings, committed=committed)
    assert outcomes == [AckOutcome.APPLIED, AckOutcome.STALE if stale else AckOutcome.APPLIED]
    assert seen == [["SUCCESS", "RUNNING" if stale else "SUCCESS"]]


def test_a_repeated_failure_ack_is_answered_once_it_ended_in_fail(storage):
    [msg_id] = insert(storage, "t.ackfail", 1, retry=0)
    [msg] = lock(storage, "t.ackfail")
    assert ack(storage, [AckItem(msg_id, msg.lease_token, False, "boom")]) == [AckOutcome.APPLIED]
    assert ack(storage, [AckItem(msg_id, msg.lease_token, False, "boom")]) == [AckOutcome.APPLIED]
    assert ack(storage, [AckItem(msg_id, msg.lease_token, True)]) == [AckOutcome.STALE]
    stored = storage.reads.get_message(msg_id)
    assert stored.status == "FAIL" and stored.trace.count("FAIL") == 1


def test_ack_failure_retries_on_schedule_then_fails(storage):
    [msg_id] = insert(storage, "t.retry", 1, retry=2, schedule=[5.0, 60.0])
    [msg] = lock(storage, "t.retry")
    before = clock.now()
    assert ack(storage, [AckItem(msg_id, msg.lease_token, False, "boom")]) == [AckOutcome.APPLIED]
    stored = storage.reads.get_message(msg_id)
    assert stored.status == "NEW" and stored.retry_remaining == 1
    assert timedelta(seconds=4.9) <= stored.effect_time - before <= timedelta(seconds=6)
    assert "RETRY" in stored.trace and "error=boom" in stored.trace
    storage.messages.requeue([], "t.retry", 0, clock.now())  # not FAIL: nothing moves
    assert storage.reads.get_message(msg_id).status == "NEW"


def test_mixed_batch_ack_in_one_call(storage):
    ids = insert(storage, "t.mix", 3, retry=0)
    got = lock(storage, "t.mix")
    items = [AckItem(got[0].id, got[0].lease_token, True), AckItem(got[1].id, got[1].lease_token, False, "bad"),
             AckItem(got[2].id, "stolen", True)]
    assert ack(storage, items) == [AckOutcome.APPLIED, AckOutcome.APPLIED, AckOutcome.STALE]
    assert [storage.reads.get_message(i).status for i in ids] == ["SUCCESS", "FAIL", "RUNNING"]


def test_touch_extends_only_a_held_lease(storage):
    insert(storage, "t.touch", 1)
    [msg] = lock(storage, "t.touch", ttr=5)
    assert storage.leases.extend_leases([(msg.id, msg.lease_token)], 600, clock.now())[0]
    assert storage.reads.get_message(msg.id).lease_expire > clock.after(clock.now(), 500)
    assert not storage.leases.extend_leases([(msg.id, "other")], 600, clock.now())[0]


def test_cancel_removes_only_pending_messages(storage):
    ids = insert(storage, "t.cancel", 2)
    lock(storage, "t.cancel", limit=1)
    assert storage.messages.cancel([ids[0], ids[1], 999999]) == [False, True, False]
    assert storage.reads.get_message(ids[1]) is None and storage.reads.get_message(ids[0]).status == "RUNNING"


def test_a_poison_message_fails_after_max_deliveries_with_a_trace_that_says_why(storage):
    """Each expired lease counts as a delivery: the third expiry of a topic with max_deliveries 3
    ends in FAIL (a dead letter) instead of NEW; a message of another topic is not affected."""
    [poison] = insert(storage, "t.poison", 1, retry=5)
    [other] = insert(storage, "t.calm", 1)
    limits = {"t.poison": 3, "t.calm": 10}
    now = clock.now()
    for delivery in range(1, 4):
        leased = {m.id for m in lock(storage, "t.poison", ttr=1) + lock(storage, "t.calm", ttr=1)}
        assert poison in leased
        now = clock.after(now, 2)
        assert storage.leases.expire_leases(now, 100, "b1", limits.__getitem__) == len(leased)
        expected = "FAIL" if delivery == 3 else "NEW"
        assert storage.reads.get_message(poison).status == expected
    dead = storage.reads.get_message(poison)
    assert (dead.attempt, dead.lease_expire, dead.retry_remaining) == (3, None, 5) and dead.finish_time is not None
    last = trace.parse(dead.trace)[-1]
    assert (last["event"] == "FAIL" and last["error"].startswith("lease_expired_3_times")
            and "max_deliveries_3" in last["error"])
    assert storage.reads.get_message(other).status == "NEW"
    assert storage.messages.requeue([poison], None, 0, clock.now()) == 1  # a dead letter like any other
    assert storage.reads.get_message(poison).status == "NEW"


def test_leases_are_extended_in_one_call_and_lost_ones_say_so(storage):
    ids = insert(storage, "t.beat", 3)
    first = lock(storage, "t.beat", limit=2, ttr=5)
    [third] = lock(storage, "t.beat", limit=1, ttr=5)
    before = {m.id: storage.reads.get_message(m.id) for m in first + [third]}
    leases = [(m.id, m.lease_token) for m in first] + [(third.id, third.lease_token), (third.id, "0" * 32),
                                                       (999999, "x")]
    assert storage.leases.extend_leases(leases, 600, clock.now()) == [True, True, True, False, False]
    for msg_id, old in before.items():
        new = storage.reads.get_message(msg_id)
        assert new.lease_expire > clock.after(old.lease_expire, 500)
        assert (new.version, new.trace, new.status) == (old.version, old.trace, "RUNNING")  # heartbeats leave no trace
    assert sorted(ids) == sorted(before)


def test_a_heartbeat_of_many_batches_extends_each_held_lease_and_only_those(storage):
    """More leases than one statement carries, under seven tokens, the last batch given back
    and one lease named twice: every held one is extended, the given-back ones are not, in order."""
    insert(storage, "t.many", 1_050)
    batches = [lock(storage, "t.many", limit=150, ttr=5) for _ in range(7)]
    held = [(m.id, m.lease_token) for batch in batches for m in batch]
    assert len(held) == 1_050 and len({token for _, token in held}) == 7
    lost_id, lost_token = held[-1]
    assert storage.leases.release(lost_token, clock.now()) == 150
    leases = held + [held[0]]
    expected = [token != lost_token for _, token in held] + [True]
    assert storage.leases.extend_leases(leases, 600, clock.now()) == expected
    assert storage.reads.get_message(held[500][0]).lease_expire > clock.after(clock.now(), 500)
    assert storage.reads.get_message(lost_id).status == "NEW"


def test_expired_leases_return_to_new_and_name_the_lost_consumer(storage):
    [msg_id] = insert(storage, "t.lease", 1)
    [msg] = lock(storage, "t.lease", ttr=1, consumer="worker-a-0000000001")
    assert storage.leases.expire_leases(clock.now(), 100, "b1", lambda topic: 10) == 0
    assert storage.leases.expire_leases(clock.after(clock.now(), 2), 100, "b1", lambda topic: 10) == 1
    stored = storage.reads.get_message(msg_id)
    assert stored.status == "NEW" and stored.lease_token is None
    assert "LEASE_EXPIRED" in stored.trace and "lost_by=worker-a-0000000001" in stored.trace
    assert ack(storage, [AckItem(msg_id, msg.lease_token, True)]) == [AckOutcome.STALE]
    [again] = lock(storage, "t.lease")
    assert again.attempt == 2


def test_leases_that_ran_out_during_a_database_outage_are_held_for_their_ttr_after_it(storage):
    """Grace for holders that could not reach the database: a lease that ran out after ``since``
    expires only once ``back`` is its ttr behind; one that ran out before ``since`` expires now."""
    insert(storage, "t.grace", 3, delay=-60)
    start = clock.now()
    [before] = storage.leases.lock_batch(LockRequest(Shard("t.grace"), "c1", 1, clock.after(start, -10),
                                                     limit=1))  # ran out at -9
    [short] = storage.leases.lock_batch(LockRequest(Shard("t.grace"), "c1", 2, start,
                                                    limit=1))  # runs out at +2, in the outage
    [long] = storage.leases.lock_batch(LockRequest(Shard("t.grace"), "c1", 20, start,
                                                   limit=1))  # runs out at +20, in the outage
    grace = OutageGrace(since=clock.after(start, -5), back=clock.after(start, 30))
    expire = lambda at: storage.leases.expire_leases(clock.after(start, at), 100, "b1", lambda topic: 10,  # noqa: E731
                                              grace=grace)
    assert expire(30) == 1 and storage.reads.get_message(before.id).status == "NEW"
    assert expire(31.5) == 0  # back + 2 s is not reached yet
    assert expire(32.5) == 1 and storage.reads.get_message(short.id).status == "NEW"
    assert expire(49) == 0 and storage.reads.get_message(long.id).status == "RUNNING"
    assert expire(51) == 1 and storage.reads.get_message(long.id).status == "NEW"


def test_requeue_moves_dead_letters_back(storage):
    ids = insert(storage, "t.dead", 3, retry=0)
    for msg in lock(storage, "t.dead"):
        ack(storage, [AckItem(msg.id, msg.lease_token, False, "x")])
    assert storage.messages.requeue([ids[0]], None, 2, clock.now()) == 1
    assert storage.reads.get_message(ids[0]).status == "NEW" and storage.reads.get_message(ids[0]).retry_remaining == 2
    assert storage.messages.requeue([], "t.dead", 0, clock.now()) == 2
    assert storage.counts.count_by_status("t.dead") == {"t.dead": {"NEW": 3}}


def test_requeue_names_the_topics_of_what_it_moved_and_of_nothing_else(storage):
    """Requeued messages are due without a new id: their topics' pulls are woken by the caller."""
    [dead, by_topic] = insert(storage, "t.requeued", 2, retry=0)
    [alive] = insert(storage, "t.requeued.not", 1)
    for msg in lock(storage, "t.requeued"):
        ack(storage, [AckItem(msg.id, msg.lease_token, False, "x")])
    topics: set[str] = set()
    assert storage.messages.requeue([dead, alive], None, 0, clock.now(), topics=topics) == 1
    assert topics == {"t.requeued"}  # the NEW one of the other topic did not move
    topics.clear()
    assert storage.messages.requeue([], "t.requeued.not", 0, clock.now(), topics=topics) == 0
    assert topics == set()
    assert storage.messages.requeue([], "t.requeued", 0, clock.now(), topics=topics) == 1
    assert topics == {"t.requeued"} and storage.reads.get_message(by_topic).status == "NEW"


def test_serial_lock_takes_the_head_only_and_keeps_order_across_retries(storage):
    storage.topics.ensure_topics(["t.serial"], clock.now())
    ids = insert(storage, "t.serial", 3, retry=1, schedule=[0.0])
    [first] = storage.leases.lock_serial(LockRequest(Shard("t.serial"), "c1", 30, clock.now()))
    assert first.id == ids[0]
    assert storage.leases.lock_serial(LockRequest(Shard("t.serial"), "c2", 30, clock.now())) == []
    assert storage.probes.serial_head_due("t.serial") is None
    ack(storage, [AckItem(first.id, first.lease_token, False, "retry me")])
    [again] = storage.leases.lock_serial(LockRequest(Shard("t.serial"), "c1", 30, clock.after(clock.now(), 1)))
    assert again.id == ids[0] and again.attempt == 2


def test_serial_head_not_due_blocks_later_messages(storage):
    storage.topics.ensure_topics(["t.sd"], clock.now())
    now = clock.now()
    storage.messages.insert_messages([NewRow("t.sd", "1", clock.after(now, 60), 0), NewRow("t.sd", "2", now, 0)], now)
    [head] = storage.leases.lock_serial(LockRequest(Shard("t.sd"), "c1", 30, now))
    assert head.data == "2"  # (order_time, id) order: the due one is first in time
    ack(storage, [AckItem(head.id, head.lease_token, True)])
    assert storage.leases.lock_serial(LockRequest(Shard("t.sd"), "c1", 30, clock.now())) == []
    assert storage.probes.serial_head_due("t.sd") == clock.after(now, 60)


def test_next_due_and_max_id(storage):
    assert storage.probes.max_id() == 0
    ids = insert(storage, "t.due", 4, delay=10)
    assert storage.probes.max_id() == max(ids)
    due = storage.probes.next_due(Shard("t.due"))
    assert due is not None and due > clock.now()
    assert storage.probes.next_due(Shard("t.none")) is None


def test_recent_inserts_reads_above_the_mark_and_the_missing_ids(storage):
    assert storage.probes.recent_inserts(0, [], 10) == ([], 0)
    ids = insert(storage, "t.recent", 5, delay=7)
    assert storage.probes.recent_inserts(max(ids), [], 10) == ([], max(ids))
    got = storage.probes.recent_inserts(ids[1], [ids[0], 10**12], 10)
    [(topic, priority, when, found)] = got.groups
    assert found == [ids[0]] + ids[2:] and got.top == max(ids)
    assert (topic, priority) == ("t.recent", 0) and when > clock.now()
    assert storage.probes.recent_inserts(0, [], 2).groups[0][3] == ids[:2]
    # The highest id comes with every look, also one above it: how the watch sees ids go back.
    assert storage.probes.recent_inserts(max(ids) + 1000, [], 10) == ([], max(ids))


def test_recent_inserts_groups_by_topic_and_priority_with_the_earliest_time(storage):
    later = insert(storage, "t.grp.a", 2, delay=60)
    sooner = insert(storage, "t.grp.a", 1, delay=5)
    urgent = storage.messages.insert_messages([NewRow("t.grp.a", '"u"', clock.after(clock.now(), 30), 0, priority=7)],
                                              clock.now())
    other = insert(storage, "t.grp.b", 1)
    beyond = insert(storage, "t.grp.b", 3)  # past the limit below
    got = storage.probes.recent_inserts(min(later) - 1, [], 5)
    assert got.top == max(beyond)
    by_key = {(topic, priority): (when, found) for topic, priority, when, found in got.groups}
    assert set(by_key) == {("t.grp.a", 0), ("t.grp.a", 7), ("t.grp.b", 0)}
    assert by_key[("t.grp.a", 0)][1] == later + sooner
    assert by_key[("t.grp.a", 7)][1] == list(urgent) and by_key[("t.grp.b", 0)][1] == other
    when = by_key[("t.grp.a", 0)][0]
    assert clock.now() < when < clock.after(clock.now(), 10)  # the group's earliest: the 5 s one
    assert by_key[("t.grp.b", 0)][0] <= clock.now()


def test_recent_inserts_reads_a_whole_look_of_ids(storage):
    ids = insert(storage, "t.grp.many", 500)  # one look's limit, in one group: nothing cut
    got = storage.probes.recent_inserts(min(ids) - 1, [], 500)
    assert [(topic, found) for topic, _, _, found in got.groups] == [("t.grp.many", ids)]


def test_retention_deletes_old_successes_only(storage):
    ids = insert(storage, "t.ret", 3, retry=0)
    got = lock(storage, "t.ret", limit=2)
    ack(storage, [AckItem(got[0].id, got[0].lease_token, True), AckItem(got[1].id, got[1].lease_token, False)])
    assert storage.messages.delete_finished("t.ret", clock.now() - timedelta(seconds=10), 100) == 0
    assert storage.messages.delete_finished("t.ret", clock.after(clock.now(), 1), 100) == 1
    assert storage.reads.get_message(ids[0]) is None
    assert storage.reads.get_message(ids[1]).status == "FAIL" and storage.reads.get_message(ids[2]).status == "NEW"


def test_topic_settings_round_trip(storage):
    storage.topics.ensure_topics(["t.x", "t.y"], clock.now())
    storage.topics.ensure_topics(["t.x"], clock.now())
    storage.topics.save_topic(TopicSettings("t.x", retry_count=7, ttr=15, paused=True, alarm_backlog=100), clock.now())
    topics = {s.name: s for s in storage.topics.list_topics()}
    assert set(topics) == {"t.x", "t.y"}
    assert topics["t.x"].retry_count == 7 and topics["t.x"].paused and topics["t.x"].alarm_backlog == 100
    assert topics["t.y"] == TopicSettings("t.y")


def test_list_messages_filters_and_keyset_pages(storage):
    insert(storage, "t.list", 5)
    insert(storage, "t.other", 2)
    page1 = list_messages(storage, MessageFilter(topic="t.list"), limit=3)
    page2 = list_messages(storage, MessageFilter(topic="t.list"), limit=3, before_id=page1[-1].id)
    assert len(page1) == 3 and len(page2) == 2
    assert [m.id for m in page1 + page2] == sorted((m.id for m in page1 + page2), reverse=True)
    assert [m.data for m in list_messages(storage, MessageFilter(text='"n": 4'), limit=10)] == ['{"n": 4}']
    assert list_messages(storage, MessageFilter(text="%"), limit=10) == []


def test_unreachable_database_raises_a_retriable_error(tmp_path):
    store = open_storage("mysql+pymysql://root@127.0.0.1:1/none")
    with pytest.raises(StorageUnavailableError):
        store.schema.ping()


def test_backlog_counts_due_scheduled_and_running_per_topic_in_one_reading(storage):
    now = clock.now()
    storage.messages.insert_messages([NewRow("t.bl", "1", clock.after(now, -30), 0), NewRow("t.bl", "2",
                                                                                            clock.after(now, -5), 0),
                             NewRow("t.bl", "3", clock.after(now, 600), 0), NewRow("t.bl2", "4", now, 0)], now)
    insert(storage, "t.done", 1)
    [done] = lock(storage, "t.done")
    ack(storage, [AckItem(done.id, done.lease_token, True)])  # finished rows are not backlog
    [leased] = storage.leases.lock_batch(LockRequest(Shard("t.bl2"), "c1", 30, now, limit=1))
    backlog = {b.topic: b for b in storage.counts.backlog(now)}
    assert set(backlog) == {"t.bl", "t.bl2"}
    assert (backlog["t.bl"].due, backlog["t.bl"].scheduled, backlog["t.bl"].running) == (2, 1, 0)
    assert backlog["t.bl"].oldest_due == clock.after(now, -30)
    assert (backlog["t.bl2"].due, backlog["t.bl2"].scheduled, backlog["t.bl2"].running) == (0, 0, 1)
    assert backlog["t.bl2"].oldest_due is None and leased.topic == "t.bl2"


def test_expired_leases_are_counted_per_topic_when_asked(storage):
    insert(storage, "t.exp1", 2)
    insert(storage, "t.exp2", 1)
    lock(storage, "t.exp1", ttr=1)
    lock(storage, "t.exp2", ttr=1)
    by_topic: dict = {"t.exp1": 1}  # added to, not replaced
    later = clock.after(clock.now(), 2)
    assert storage.leases.expire_leases(later, 100, "b1", lambda topic: 10, by_topic) == 3
    assert by_topic == {"t.exp1": 3, "t.exp2": 1}


def test_id_step_is_how_far_apart_the_ids_of_one_server_are(storage):
    a, b = insert(storage, "conf.step", 2)
    # Ids of one multi-row insert on one server are one step apart: 1 on one server, n on a
    # Galera cluster of n nodes.
    assert b - a == storage.probes.id_step() >= 1
