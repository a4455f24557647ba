"""One conformance suite, run against every storage implementation (memory, SQLite, MariaDB, Galera)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from tests.observe import list_messages
from tidemq.errors import StorageUnavailableError
from tidemq import clock, trace
from tidemq.lifecycle import next_delay
from tidemq_broker.storage import (AckItem, AckOutcome, LockHint, LockRequest, MessageFilter, NewRow, OutageGrace,
                                  RequestRef, Shard, TopicSettings)
from tidemq_broker.storages import open_storage


@pytest.fixture
def storage(any_storage):
    return any_storage


def rows(topic, n, delay=0.0, **kw):
    now = clock.now()
    return [NewRow(topic=topic, data=f'{{"n": {i}}}', effect_time=clock.after(now, delay), retry_remaining=kw.get("retry", 0),
                   retry_schedule=kw.get("schedule"), unique_key=(f"{kw['key']}-{i}" if kw.get("key") else None))
            for i in range(n)]


def insert(storage, topic, n, **kw):
    return storage.messages.insert_messages(rows(topic, n, **kw), clock.now())


def lock(storage, topic, limit=100, rank=0, total=1, ttr=30, consumer="c1"):
    return storage.leases.lock_batch(LockRequest(Shard(topic, rank, total), consumer, ttr, clock.now(), limit=limit))


def settings(name):
    return TopicSettings(name)


def ack(storage, items):
    return storage.acks.ack(items, clock.now(), "c1", "b1", settings)


def test_insert_returns_ids_in_order_and_stores_rows(storage):
    ids = insert(storage, "t.a", 5)
    assert ids == sorted(ids) and len(set(ids)) == 5
    stored = [storage.reads.get_message(i) for i in ids]
    assert [m.data for m in stored] == [f'{{"n": {i}}}' for i in range(5)]
    assert {m.status for m in stored} == {"NEW"}
    assert [e["event"] for e in trace.parse(stored[0].trace)] == ["PRODUCED"]


def test_millisecond_effect_time_round_trips(storage):
    moment = clock.after(clock.now(), 1.234)
    [msg_id] = storage.messages.insert_messages([NewRow("t.ms", "1", moment, 0)], clock.now())
    assert storage.reads.get_message(msg_id).effect_time == moment


def test_unique_key_deduplicates_within_and_across_batches(storage):
    now = clock.now()
    batch = [NewRow("t.u", "1", now, 0, unique_key="k1"), NewRow("t.u", "2", now, 0, unique_key="k1"),
             NewRow("t.u", "3", now, 0), NewRow("t.other", "4", now, 0, unique_key="k1")]
    ids = storage.messages.insert_messages(batch, now)
    assert ids[0] == ids[1] and len({ids[0], ids[2], ids[3]}) == 3
    again = storage.messages.insert_messages([NewRow("t.u", "9", now, 0, unique_key="k1")], now)
    assert again == [ids[0]]
    # Both insert paths (plain and deduplicating) pass a literal % and quotes through intact.
    odd = ['"50% off, 100%s"', '"it\'s %(x)s"']
    got = storage.messages.insert_messages([NewRow("t.u", odd[0], now, 0, unique_key="pct"), NewRow("t.u", odd[1], now,
                                                                                                    0),
                                   NewRow("t.u", odd[0], now, 0)], now)
    assert [storage.reads.get_message(i).data for i in got] == [odd[0], odd[1], odd[0]]
    assert storage.reads.get_message(ids[0]).data == "1"
    assert storage.counts.count_by_status("t.u") == {"t.u": {"NEW": 5}}


def test_every_character_a_string_literal_escapes_comes_back_intact(storage):
    now = clock.now()
    odd = ['"back\\slash \\" and \\\\"', "it's 'quoted'", "nul\0 cr\r lf\n sub\x1a tab\t", 'ünï ✓ 50%',
           '{"a": "\\u00e9\\n"}', "\\", "'", '"']
    rows = [NewRow("t.esc", data, now, 0) for data in odd]
    plain = storage.messages.insert_messages(rows, now)
    answered = storage.messages.insert_messages(rows, now, [RequestRef("esc-call", 0,
                                                                       len(rows))])  # the one-string path
    assert [storage.reads.get_message(i).data for i in plain] == odd
    assert [storage.reads.get_message(i).data for i in answered] == odd


def test_a_failing_batch_stores_nothing(storage):
    insert(storage, "t.keep", 2)
    now = clock.now()
    bad = [NewRow("t.bad", "1", now, 0), NewRow("t.bad", None, now, 0)]  # NOT NULL violated
    with pytest.raises(Exception):
        storage.messages.insert_messages(bad, now)
    assert storage.counts.count_by_status() == {"t.keep": {"NEW": 2}}


def test_lock_takes_only_due_messages_oldest_first_up_to_limit(storage):
    due = insert(storage, "t.l", 5)
    insert(storage, "t.l", 3, delay=60)
    got = lock(storage, "t.l", limit=3)
    assert [m.id for m in got] == due[:3]
    assert {m.status for m in got} == {"RUNNING"} and len({m.lease_token for m in got}) == 1
    assert all(m.attempt == 1 and m.consumer == "c1" for m in got)
    rest = lock(storage, "t.l", limit=10)
    assert [m.id for m in rest] == due[3:]
    assert lock(storage, "t.l") == []


def test_leasing_ahead_takes_what_is_due_within_the_window_under_a_lease_that_covers_the_wait(storage):
    now = clock.now()
    soon = storage.messages.insert_messages([NewRow("t.ahead", str(n), clock.after(now, 20), 0) for n in range(2)], now)
    later = storage.messages.insert_messages([NewRow("t.ahead", "2", clock.after(now, 90), 0)], now)
    assert storage.leases.lock_batch(LockRequest(Shard("t.ahead"), "c1", 30, now, limit=10)) == []  # nothing due now
    leased = storage.leases.lock_batch(LockRequest(Shard("t.ahead"), "c1", 30, now, limit=10, ahead=60))
    assert [m.id for m in leased] == soon  # due within 60 s; the one due in 90 s stays NEW
    assert all(m.effect_time == clock.after(now, 20) for m in leased)  # the consumer starts it then
    for m in leased:
        stored = storage.reads.get_message(m.id)
        assert stored.status == "RUNNING" and stored.lease_expire == clock.after(now, 60 + 30)
        assert "ahead=60s" in stored.trace
    assert storage.reads.get_message(later[0]).status == "NEW"


def test_a_serial_head_is_leased_ahead_only_within_the_window(storage):
    storage.topics.ensure_topics(["t.serial.ahead"], clock.now())
    now = clock.now()
    [head] = storage.messages.insert_messages([NewRow("t.serial.ahead", "0", clock.after(now, 20), 0)], now)
    assert storage.leases.lock_serial(LockRequest(Shard("t.serial.ahead"), "c1", 30, now, ahead=10)) == []
    [leased] = storage.leases.lock_serial(LockRequest(Shard("t.serial.ahead"), "c1", 30, now, ahead=30))
    assert leased.id == head and storage.reads.get_message(head).lease_expire == clock.after(now, 60)


def test_a_delivery_is_what_the_lock_stored(storage):
    """The lock builds its deliveries from the rows it read plus the values it set: they must
    match the stored rows field for field."""
    insert(storage, "t.same", 3, retry=2)
    got = lock(storage, "t.same", ttr=45, consumer="worker-7")
    assert len(got) == 3
    for msg in got:
        stored = storage.reads.get_message(msg.id)
        assert (msg.topic, msg.data, msg.status, msg.effect_time, msg.retry_remaining, msg.attempt, msg.ttr,
                msg.lease_token, msg.consumer) == (
            stored.topic, stored.data, stored.status, stored.effect_time, stored.retry_remaining, stored.attempt,
            stored.ttr, stored.lease_token, stored.consumer)
        assert [e["event"] for e in trace.parse(stored.trace)] == ["PRODUCED", "LOCKED"]


def test_a_trace_context_is_stored_and_handed_out_with_every_lease(storage):
    """The producer's traceparent goes in with the row (on the shared-request path and the plain
    one), comes back with the lease, is kept for a retry, and stays apart from the trace."""
    now = clock.now()
    contexts = ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None,
                "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203332-00"]
    new = [NewRow("t.otel", str(i), now, 1, trace_context=c) for i, c in enumerate(contexts)]
    ids = storage.messages.insert_messages(new[:2], now, [RequestRef("otel-req", 0,
                                                                     2)]) + storage.messages.insert_messages(new[2:],
                                                                                                             now)
    assert [storage.reads.get_message(i).trace_context for i in ids] == contexts
    first = {m.id: m for m in lock(storage, "t.otel")}
    assert [first[i].trace_context for i in ids] == contexts
    ack(storage, [AckItem(ids[0], first[ids[0]].lease_token, False, "boom")])
    stored = storage.reads.get_message(ids[0])  # back to NEW for its retry, with its context
    assert (stored.status, stored.trace_context) == ("NEW", contexts[0]) and contexts[0] not in stored.trace


def test_lease_expire_is_set_only_while_running(storage):
    """The console pages one status through (status, lease_expire) with lease_expire NULL: every
    way out of RUNNING must clear it."""
    ids = insert(storage, "t.inv", 4, retry=1) + insert(storage, "t.inv0", 2, retry=0)
    got = {m.id: m for m in lock(storage, "t.inv") + lock(storage, "t.inv0")}
    items = [AckItem(ids[0], got[ids[0]].lease_token, True),          # -> SUCCESS
             AckItem(ids[1], got[ids[1]].lease_token, False, "x"),    # -> NEW (retry)
             AckItem(ids[4], got[ids[4]].lease_token, False, "x")]    # -> FAIL
    assert ack(storage, items) == [AckOutcome.APPLIED] * 3
    # The oldest lease -> NEW.
    storage.leases.expire_leases(clock.after(clock.now(), 31), 1, "b1", lambda topic: 10)
    storage.messages.requeue([ids[4]], None, 0, clock.now())    # FAIL -> NEW
    states = {i: storage.reads.get_message(i) for i in ids}
    assert {m.status for m in states.values()} >= {"SUCCESS", "NEW", "RUNNING"}
    for msg in states.values():
        assert (msg.lease_expire is not None) == (msg.status == "RUNNING"), msg
    # The console lists each status in full through that index.
    console = storage.console
    for status in ("NEW", "RUNNING", "SUCCESS"):
        listed = console.list_page(MessageFilter(status=status), 100).messages
        assert sorted(m.id for m in listed) == sorted(
            i for i, m in states.items() if m.status == status)


def test_a_retried_pull_reads_back_only_its_own_lease_and_release_gives_back_both(storage):
    """A pull retried with the same token (its first reply lost) gets only what it leased itself;
    the caller releases the token before retrying, which returns both leases to NEW."""
    ids = insert(storage, "t.retry.pull", 4)
    token = "ab" * 16
    first = storage.leases.lock_batch(LockRequest(Shard("t.retry.pull"), "c1", 30, clock.now(), limit=2,
                                                  lease_token=token))
    second = storage.leases.lock_batch(LockRequest(Shard("t.retry.pull"), "c1", 30, clock.after(clock.now(), 0.01),
                                                   limit=2, lease_token=token))
    assert [m.id for m in first] == ids[:2] and [m.id for m in second] == ids[2:]
    assert storage.leases.release(token, clock.now()) == 4
    assert {storage.reads.get_message(i).status for i in ids} == {"NEW"}


def id_step(storage) -> int:
    """How far apart one server's ids are (3 on a 3-node Galera cluster, 1 on one server)."""
    return storage.probes.id_step()


def test_lock_shards_by_id_modulo_total(storage):
    ids = insert(storage, "t.s", 30)
    step = id_step(storage)
    seen = []
    for rank in range(3):
        got = lock(storage, "t.s", rank=rank, total=3)
        assert all((m.id // step) % 3 == rank for m in got)
        assert 8 <= len(got) <= 12  # ids of one server step alike: the shards still split them evenly
        seen += [m.id for m in got]
    assert sorted(seen) == ids


def test_a_lock_takes_other_shards_messages_once_stranded_and_its_own_first(storage):
    step = id_step(storage)
    now = clock.now()
    old = storage.messages.insert_messages([NewRow("t.str", f'"old{i}"', clock.after(now, -5), 0) for i in range(6)],
                                           now)
    fresh = storage.messages.insert_messages([NewRow("t.str", f'"new{i}"', now, 0) for i in range(6)], now)

    def shard(ids, rank):
        return [i for i in ids if (i // step) % 2 == rank]

    # Stranded: due for longer than 2 s. The fresh ones of shard 1 are not; its old ones are.
    got = storage.leases.lock_batch(LockRequest(Shard("t.str", 0, 2, LockHint(stranded=2.0)), "c0", 30, clock.now(),
                                                limit=100))
    assert sorted(m.id for m in got) == sorted(shard(old, 0) + shard(fresh, 0) + shard(old, 1))
    assert [m.id for m in got] == sorted(old)[: len(shard(old, 0)) + len(shard(old, 1))] + shard(fresh, 0)  # oldest first
    assert shard(old, 0) and shard(old, 1)
    # With no room left after its own, a lock takes no stranded message.
    storage.messages.insert_messages([NewRow("t.str", f'"late{i}"', clock.after(now, -5), 0) for i in range(6)], now)
    again = storage.leases.lock_batch(LockRequest(Shard("t.str", 1, 2, LockHint(stranded=2.0)), "c1", 30, clock.now(),
                                                  limit=2))
    assert len(again) == 2 and all((m.id // step) % 2 == 1 for m in again)
    # A lock fills its batch with its own shard first, whatever the others' times.
    # The next due time counts another shard's message from when it becomes stranded.
    storage.messages.insert_messages([NewRow("t.str2", '"x"', clock.after(now, 10), 0) for _ in range(2 * step)], now)
    due = {rank: storage.probes.next_due(Shard("t.str2", rank, 2, LockHint(stranded=3.0))) for rank in range(2)}
    plain = {rank: storage.probes.next_due(Shard("t.str2", rank, 2)) for rank in range(2)}
    assert plain[0] == plain[1] == clock.after(now, 10) and due == plain  # both shards have one
    lone = storage.messages.insert_messages([NewRow("t.str3", '"x"', clock.after(now, 10), 0)], now)[0]
    other = 1 - (lone // step) % 2
    assert storage.probes.next_due(Shard("t.str3", other, 2)) is None
    assert storage.probes.next_due(Shard("t.str3", other, 2, LockHint(stranded=3.0))) == clock.after(now, 13)


def test_a_lock_and_the_next_due_probe_read_from_the_floor(storage):
    now = clock.now()
    early = storage.messages.insert_messages([NewRow("t.floor", '"early"', clock.after(now, -60), 0)], now)
    late = storage.messages.insert_messages([NewRow("t.floor", '"late"', clock.after(now, -1), 0)], now)
    floor = clock.after(now, -30)
    assert storage.probes.next_due(Shard("t.floor", 0, 1, LockHint(floor=floor))) == clock.after(now, -1)
    assert storage.probes.next_due(Shard("t.floor")) == clock.after(now, -60)
    got = storage.leases.lock_batch(LockRequest(Shard("t.floor", 0, 1, LockHint(floor=floor)), "c", 30, clock.now(),
                                                limit=10))
    none = storage.leases.lock_batch(LockRequest(Shard("t.floor", 0, 1, LockHint(priorities=frozenset({5}))), "c", 30,
                                                 clock.now(), limit=10))
    assert none == []  # a priority the hint does not name is not read
    assert [m.id for m in got] == late  # the floor promised nothing earlier: the lock believes it
    assert [m.id for m in lock(storage, "t.floor")] == early


def test_concurrent_locks_never_hand_out_a_message_twice(storage):
    ids = insert(storage, "t.c", 400)
    taken: list[int] = []
    guard = threading.Lock()

    def take():
        while True:
            got = lock(storage, "t.c", limit=7)
            if not got:
                return
            with guard:
                taken.extend(m.id for m in got)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == ids


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
    assert last["event"] == "FAIL" and last["error"].startswith("lease_expired_3_times") and "max_deliveries_3" in last["error"]
    assert storage.reads.get_message(other).status == "NEW"
    assert storage.messages.requeue([poison], None, 0, clock.now()) == 1  # a dead letter like any other
    assert storage.reads.get_message(poison).status == "NEW"


def test_leases_are_extended_in_one_call_and_lost_ones_say_so(storage):
    ids = insert(storage, "t.beat", 3)
    first = lock(storage, "t.beat", limit=2, ttr=5)
    [third] = lock(storage, "t.beat", limit=1, ttr=5)
    before = {m.id: storage.reads.get_message(m.id) for m in first + [third]}
    leases = [(m.id, m.lease_token) for m in first] + [(third.id, third.lease_token), (third.id, "0" * 32), (999999, "x")]
    assert storage.leases.extend_leases(leases, 600, clock.now()) == [True, True, True, False, False]
    for msg_id, old in before.items():
        new = storage.reads.get_message(msg_id)
        assert new.lease_expire > clock.after(old.lease_expire, 500)
        assert (new.version, new.trace, new.status) == (old.version, old.trace, "RUNNING")  # heartbeats leave no trace
    assert sorted(ids) == sorted(before)


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
    assert [row[0] for row in got.rows] == [ids[0]] + ids[2:] and got.top == max(ids)
    assert {row[1] for row in got.rows} == {"t.recent"} and all(row[2] > clock.now() for row in got.rows)
    assert {row[3] for row in got.rows} == {0}  # the priority
    assert [row[0] for row in storage.probes.recent_inserts(0, [], 2).rows] == ids[:2]
    # The highest id comes with every look, also one above it: how the watch sees ids go back.
    assert storage.probes.recent_inserts(max(ids) + 1000, [], 10) == ([], max(ids))


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
