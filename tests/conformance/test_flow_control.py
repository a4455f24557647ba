"""Flow control in the lock, for every storage: priorities, the running limit, the rate and the
per-key limit (storages/flow.py)."""

from __future__ import annotations

import pytest

from tidemq import clock
from tidemq_broker.flow import FIRST_DEPTH, KEY_WINDOW
from tidemq_broker.storage import AckItem, FlowLimits, LockHint, LockRequest, NewRow, Shard, TopicSettings


@pytest.fixture
def storage(any_storage):
    return any_storage


def produce(storage, topic, items, delay=0.0):
    """``items``: (priority, flow_key) per message, produced in that order; returns the ids."""
    now = clock.now()
    return storage.messages.insert_messages([NewRow(topic, f'{{"n": {i}}}', clock.after(now, delay), 0,
                                                    priority=priority,
                                           flow_key=key) for i, (priority, key) in enumerate(items)], now)


def lock(storage, topic, limit=100, limits=None, now=None, rank=0, total=1):
    return storage.leases.lock_batch(LockRequest(Shard(topic, rank, total), "c1", 30, now or clock.now(), limit=limit,
                                                 limits=limits))


def limit(storage, topic, **values):
    limits = FlowLimits(**values)
    storage.topics.set_topic_limits(topic, limits, clock.now())
    return limits


def test_higher_priority_first_then_oldest(storage):
    ids = produce(storage, "f.prio", [(0, None), (5, None), (9, None), (0, None), (5, None), (9, None)])
    got = lock(storage, "f.prio", limit=3)
    assert [m.id for m in got] == [ids[2], ids[5], ids[1]]
    assert [m.id for m in lock(storage, "f.prio")] == [ids[4], ids[0], ids[3]]


def test_priority_of_a_message_not_yet_due_does_not_hold_back_due_ones(storage):
    [later] = produce(storage, "f.prio.due", [(9, None)], delay=3600)
    due = produce(storage, "f.prio.due", [(0, None), (1, None)])
    assert [m.id for m in lock(storage, "f.prio.due")] == [due[1], due[0]]
    assert storage.reads.get_message(later).status == "NEW"


def test_next_due_and_earliest_new_look_at_every_priority(storage):
    now = clock.now()
    storage.messages.insert_messages([NewRow("f.due", "1", clock.after(now, 50), 0, priority=9),
                             NewRow("f.due", "2", clock.after(now, 20), 0, priority=0),
                             NewRow("f.due", "3", clock.after(now, 30), 0, priority=4)], now)
    assert storage.probes.next_due(Shard("f.due")) == clock.after(now, 20)
    both = {"f.due": {0: clock.after(now, 20), 4: clock.after(now, 30), 9: clock.after(now, 50)}}
    assert storage.probes.earliest_new(["f.due", "f.none"]) == both
    # One topic alone (the usual case of a hub with one waiting topic), and many (in chunks).
    assert storage.probes.earliest_new(["f.due"]) == both
    assert storage.probes.earliest_new(["f.none"]) == {}
    many = [f"f.many.{i}" for i in range(45)]
    storage.messages.insert_messages([NewRow(topic, "1", clock.after(now, i), 0) for i, topic in enumerate(many)], now)
    assert storage.probes.earliest_new(["f.due", *many]) == {**both, **{t: {0: clock.after(now, i)} for i,
                                                                        t in enumerate(many)}}
    # A lock and the next-due probe read only the priorities a hint names.
    assert storage.probes.next_due(Shard("f.due", 0, 1, LockHint(priorities=frozenset({4, 9})))) == clock.after(now, 30)
    assert storage.probes.next_due(Shard("f.due", 0, 1, LockHint(priorities=frozenset()))) is None


def test_limits_round_trip_through_topic_settings(storage):
    limit(storage, "f.settings", max_running=4, rate_per_second=2.5, max_running_per_key=1)
    [stored] = [s for s in storage.topics.list_topics() if s.name == "f.settings"]
    assert stored.limits == FlowLimits(4, 2.5, 1)
    storage.topics.save_topic(TopicSettings("f.plain"), clock.now())
    assert [s.limits for s in storage.topics.list_topics() if s.name == "f.plain"] == [None]


def test_max_running_caps_leases_until_acks_make_room(storage):
    limits = limit(storage, "f.run", max_running=3)
    produce(storage, "f.run", [(0, None)] * 10)
    first = lock(storage, "f.run", limit=10, limits=limits)
    assert len(first) == 3
    assert lock(storage, "f.run", limit=10, limits=limits) == []
    storage.acks.ack([AckItem(first[0].id, first[0].lease_token, True)], clock.now(), "c1", "b1", TopicSettings)
    assert len(lock(storage, "f.run", limit=10, limits=limits)) == 1


def test_max_running_holds_across_shards(storage):
    limits = limit(storage, "f.shards", max_running=4)
    produce(storage, "f.shards", [(0, None)] * 20)
    taken = [len(lock(storage, "f.shards", limit=10, limits=limits, rank=rank, total=2)) for rank in (0, 1, 0, 1)]
    assert sum(taken) == 4 and taken[0] == 4


def test_the_stored_limits_decide_not_the_callers_copy(storage):
    limit(storage, "f.stale", max_running=2)
    produce(storage, "f.stale", [(0, None)] * 5)
    assert len(lock(storage, "f.stale", limit=5, limits=FlowLimits(max_running=50))) == 2


def test_rate_takes_a_tenth_of_a_second_at_once_then_what_time_adds(storage):
    """After an idle spell a tenth of a second's worth at once; then what time adds, a late pull
    catching up (up to a second's worth); after more than a second without a lease, idle again."""
    limits = limit(storage, "f.rate", rate_per_second=100)
    produce(storage, "f.rate", [(0, None)] * 100)
    start = clock.now()
    assert len(lock(storage, "f.rate", limit=100, limits=limits, now=start)) == 10
    assert lock(storage, "f.rate", limit=100, limits=limits, now=start) == []
    assert len(lock(storage, "f.rate", limit=100, limits=limits, now=clock.after(start, 0.05))) == 5
    # A pull 0.3 s late catches up the 30 that accrued meanwhile.
    assert len(lock(storage, "f.rate", limit=100, limits=limits, now=clock.after(start, 0.35))) == 30
    # More than a second without a lease is idleness: the bucket starts over at a tenth of a second.
    assert len(lock(storage, "f.rate", limit=100, limits=limits, now=clock.after(start, 1.5))) == 10


def test_a_slow_rate_starts_one_at_a_time(storage):
    limits = limit(storage, "f.slow", rate_per_second=2)
    produce(storage, "f.slow", [(0, None)] * 5)
    start = clock.now()
    assert len(lock(storage, "f.slow", limits=limits, now=start)) == 1
    assert lock(storage, "f.slow", limits=limits, now=clock.after(start, 0.4)) == []
    assert len(lock(storage, "f.slow", limits=limits, now=clock.after(start, 0.5))) == 1


def test_per_key_limit_passes_over_keys_at_their_limit(storage):
    limits = limit(storage, "f.key", max_running_per_key=1)
    ids = produce(storage, "f.key", [(0, "a"), (0, "a"), (0, "b"), (0, None), (0, "a"), (0, None), (0, "b")])
    got = lock(storage, "f.key", limits=limits)
    assert sorted(m.id for m in got) == [ids[0], ids[2], ids[3], ids[5]]
    assert lock(storage, "f.key", limits=limits) == []
    a = next(m for m in got if m.id == ids[0])
    storage.acks.ack([AckItem(a.id, a.lease_token, True)], clock.now(), "c1", "b1", TopicSettings)
    assert [m.id for m in lock(storage, "f.key", limits=limits)] == [ids[1]]


def test_per_key_limit_looks_past_a_key_at_its_limit_up_to_the_window(storage):
    # A lock of 2 first reads 2 x FIRST_DEPTH candidates: all of key "a", one of which it may
    # take. The others are further down the window (KEY_WINDOW per message), and must be found.
    assert FIRST_DEPTH < KEY_WINDOW
    depth = 2 * FIRST_DEPTH + 2
    limits = limit(storage, "f.deep", max_running_per_key=1)
    ids = produce(storage, "f.deep", [(0, "a")] * depth + [(0, "b"), (0, "c")])
    assert [m.id for m in lock(storage, "f.deep", limit=2, limits=limits)] == [ids[0], ids[depth]]
    assert [m.id for m in lock(storage, "f.deep", limit=2, limits=limits)] == [ids[depth + 1]]
    # Beyond the window: a lock of 1 reads KEY_WINDOW candidates, every one of key "a" (held).
    far = produce(storage, "f.far", [(0, "a")] * (KEY_WINDOW + 1) + [(0, "b")])
    limits = limit(storage, "f.far", max_running_per_key=1)
    assert [m.id for m in lock(storage, "f.far", limit=1, limits=limits)] == [far[0]]
    assert lock(storage, "f.far", limit=1, limits=limits) == []


def test_per_key_and_running_limits_together_follow_priority(storage):
    limits = limit(storage, "f.both", max_running=2, max_running_per_key=1)
    ids = produce(storage, "f.both", [(0, "x"), (9, "y"), (9, "y"), (5, "z")])
    assert [m.id for m in lock(storage, "f.both", limits=limits)] == [ids[1], ids[3]]


def test_topics_without_limits_are_not_limited(storage):
    produce(storage, "f.free", [(0, "k")] * 6)
    limit(storage, "f.other", max_running=1)
    assert len(lock(storage, "f.free", limits=None)) == 6
