"""One conformance suite, run against every storage implementation (memory, SQLite, MariaDB, Galera):
writes and locks (this file), outcomes, leases, probes and reads (test_storage_outcomes.py)."""

from __future__ import annotations

import threading

import pytest

from tests.conformance.storage_ops import ack, id_step, insert, lock, rows
from tidemq import clock, trace
from tidemq_broker.storage import AckItem, AckOutcome, LockHint, LockRequest, MessageFilter, NewRow, RequestRef, Shard


@pytest.fixture
def storage(any_storage):
    return any_storage


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
    # oldest first
    assert [m.id for m in got] == sorted(old)[: len(shard(old, 0)) + len(shard(old, 1))] + shard(fresh, 0)
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


def test_a_full_lock_says_whether_it_took_everything_due(storage):
    """A lock whose batch is full still knows whether the shard holds more due messages: the
    re-pull of a consumer that takes one message at a time waits instead of locking again."""
    ids = insert(storage, "t.drain", 2)
    first = lock(storage, "t.drain", limit=1)
    assert [m.id for m in first] == ids[:1] and not first.drained  # one more is due
    second = lock(storage, "t.drain", limit=1)
    assert [m.id for m in second] == ids[1:] and second.drained  # full, and nothing else is due
    storage.messages.insert_messages(rows("t.drain", 1, delay=60), clock.now())
    idle = lock(storage, "t.drain", limit=1)
    assert idle == [] and idle.drained  # the later one is not due: nothing is left behind


def test_a_shards_own_ranges_start_at_its_cursor_and_the_lock_says_where_it_left_them(storage):
    now = clock.now()

    def at(seconds, priority=0):
        return storage.messages.insert_messages([NewRow("t.cur", f'"{seconds}"', clock.after(now, seconds), 0,
                                                        priority=priority)], now)[0]

    low = {s: at(s) for s in (-50, -40, -30, -20, -10)}
    high = at(-40, priority=4)
    cursor = LockHint(floors=((0, clock.after(now, -35)),))
    assert storage.probes.next_due(Shard("t.cur", 0, 1, cursor)) == clock.after(now, -40)  # priority 4 has none
    assert storage.probes.next_due(Shard("t.cur", 0, 1, LockHint(floors=((0, clock.after(now, -15)),),
                                                                priorities=frozenset({0})))) == clock.after(now, -10)
    request = LockRequest(Shard("t.cur", 0, 1, cursor), "c", 30, now, limit=2)
    got = storage.leases.lock_batch(request)
    assert [m.id for m in got] == [high, low[-30]]  # higher priority first; nothing of 0 below its cursor
    # Priority 4 was read to its end; priority 0 holds more from -20 on (a full range, or the
    # earliest left): where the shard's next lock may start.
    assert got.reached == {**{p: now for p in range(10)}, 0: clock.after(now, -20)}
    assert [m.id for m in lock(storage, "t.cur")] == [low[-50], low[-40], low[-20], low[-10]]
