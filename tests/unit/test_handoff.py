"""Hand-offs (``tidemq_broker.handoff``): a commit leases what it makes due to the pulls waiting
for it, in its own transaction. Real long-polls on threads, the group-commit writer and the
ack against the memory storage; no sleeps, every wait is for a condition."""

from __future__ import annotations

import threading
import time
from typing import Optional

import pytest

from tests.servers import wait_until
from tidemq import clock
from tidemq.link import AckItem
from tidemq.lifecycle import MessageStatus
from tidemq_broker.handoff import Handed, HandOff
from tidemq_broker.pulls import PullHub, Quiet, long_poll
from tidemq_broker.records import LockRequest, NewRow, Shard, TopicSettings, WorkflowStep
from tidemq_broker.storages.memory import open_memory_storage
from tidemq_broker.topics import TopicCache
from tidemq_broker.waiters import FOREVER
from tidemq_broker.writer import GroupCommitWriter

_RUNNING, _NEW = MessageStatus.RUNNING.value, MessageStatus.NEW.value


@pytest.fixture
def storage():
    return open_memory_storage()


@pytest.fixture
def hub(storage):
    hub = PullHub(storage.probes, probe_interval=60, recheck=60)  # only commits wake a waiter here
    hub.start()
    yield hub
    hub.stop()


def _writer(storage, hub, pulls=True) -> GroupCommitWriter:
    return GroupCommitWriter(storage.messages, TopicCache(storage.topics), "b:1", hub.notify_commit,
                             pulls=hub if pulls else None)


def _row(topic: str, n: int = 0, delay: float = 0.0, priority: int = 0) -> NewRow:
    return NewRow(topic=topic, data=f'{{"n": {n}}}', effect_time=clock.after(clock.now(), delay), retry_remaining=0,
                  priority=priority)


class Pull:
    """One broker-side long-poll on a thread, as ``BrokerService.Pull`` runs it: its own locks
    are counted; a commit may hand it messages while it waits."""

    def __init__(self, storage, hub: PullHub, topic: str, rank: int = 0, total: int = 1, limit: int = 10,
                 wait: float = 60.0, token: str = "", gone: Optional[threading.Event] = None,
                 quiet: bool = True, paused=lambda: False) -> None:
        self.storage, self.hub, self.topic = storage, hub, topic
        self.shard = Shard(topic, rank, total)
        self.limit, self.token = limit, token or f"token-{topic}-{rank}"
        self.locks = 0
        self.gone = gone or threading.Event()
        self.paused = paused
        self.result: list = []
        self.quiet = Quiet(topic, rank, total, 0.0, limit) if quiet else None
        self.deadline = time.monotonic() + wait
        self._thread = threading.Thread(target=lambda: self.result.append(long_poll(
            hub, self.deadline, self._attempt, lambda: storage.probes.next_due(self.shard), topic,
            alive=lambda: not self.gone.is_set(), quiet=self.quiet, taker=self._taker)), daemon=True)

    def request(self, now) -> LockRequest:
        return LockRequest(self.shard, "c-" + self.token, 30, now, limit=self.limit, lease_token=self.token,
                           broker="b:1")

    def _attempt(self):
        self.locks += 1
        if self.gone.is_set() or self.paused():
            return []  # as the service's attempt: nothing for a caller that left or a paused topic
        return self.storage.leases.lock_batch(self.request(clock.now()))

    def _taker(self, now):
        return None if self.gone.is_set() or self.paused() else self.request(now)

    def start(self) -> "Pull":
        self._thread.start()
        wait_until(self.waiting, 10, what=f"the pull of {self.topic} {self.shard.rank}/{self.shard.total} to wait")
        return self

    def waiting(self) -> bool:
        """Asleep (a wake-up time set), and open to hand-offs when it takes them."""
        shard = None if self.shard.total <= 1 else (self.shard.rank, self.shard.total)
        with self.hub._lock:
            return any(w.wake_at != FOREVER and (w.open or self.quiet is None) and w.shard == shard
                       for w in self.hub._waiters.get(self.topic, ()))

    def join(self) -> list:
        self._thread.join(30)
        assert not self._thread.is_alive(), "the pull did not end"
        return self.result[0]


def test_a_produce_hands_its_message_to_the_waiting_pull_leased_in_its_own_commit(storage, hub):
    pull = Pull(storage, hub, "t.hand").start()
    assert pull.locks == 1  # its own lock found nothing
    writer = _writer(storage, hub)
    [id] = writer.write([_row("t.hand")], 10)
    # The produce returned: the message is already leased to the pull, under its token.
    assert storage.reads.get_message(id).status == _RUNNING
    assert storage.reads.get_message(id).lease_token == pull.token
    found = pull.join()
    assert isinstance(found, Handed) and [m.id for m in found] == [id]
    assert found[0].lease_token == pull.token and found[0].consumer == "c-" + pull.token and found[0].attempt == 1
    assert found[0].data == '{"n": 0}'
    assert pull.locks == 1  # no lock of its own for it
    assert "rank=0/1" in storage.reads.get_message(id).trace  # the lease's trace line, as a lock writes it


def test_without_the_hub_a_commit_only_wakes_the_pull_which_locks_itself(storage, hub):
    pull = Pull(storage, hub, "t.nohand").start()
    [id] = _writer(storage, hub, pulls=False).write([_row("t.nohand")], 10)
    found = pull.join()
    assert not isinstance(found, Handed) and [m.id for m in found] == [id]
    assert pull.locks == 2


def test_each_shard_gets_its_own_messages_and_a_pull_no_more_than_its_size(storage, hub):
    step = storage.probes.id_step()
    pulls = [Pull(storage, hub, "t.shards", rank=r, total=2, limit=2).start() for r in (0, 1)]
    ids = _writer(storage, hub).write([_row("t.shards", n) for n in range(8)], 10)
    for rank, pull in enumerate(pulls):
        got = [m.id for m in pull.join()]
        mine = [id for id in ids if (id // step) % 2 == rank]
        assert got == mine[:2]  # in id order (same priority and time), at most its size
    leased = {m.id for pull in pulls for m in pull.result[0]}
    left = [id for id in ids if id not in leased]
    assert len(left) == 4 and all(storage.reads.get_message(id).status == _NEW for id in left)


def test_a_shard_whose_pull_does_not_wait_here_is_handed_to_a_pull_here_with_room(storage, hub):
    step = storage.probes.id_step()
    pull = Pull(storage, hub, "t.foreign", rank=0, total=2, limit=4).start()
    ids = _writer(storage, hub).write([_row("t.foreign", n) for n in range(6)], 10)
    got = [m.id for m in pull.join()]
    mine = [id for id in ids if (id // step) % 2 == 0]
    others = [id for id in ids if (id // step) % 2 == 1]
    assert len(mine) < 4 and others  # room left, and another shard's messages to take
    # Its own shard first, then what no pull here waits for, up to its size, in id order.
    assert got == sorted(mine + others[:4 - len(mine)])
    left = [id for id in ids if id not in got]
    assert all(storage.reads.get_message(id).status == _NEW for id in left)


def test_higher_priorities_go_first_and_messages_not_due_are_not_handed(storage, hub):
    pull = Pull(storage, hub, "t.order", limit=2).start()
    low, later, high = _writer(storage, hub).write(
        [_row("t.order", 0), _row("t.order", 1, delay=3600), _row("t.order", 2, priority=5)], 10)
    assert [m.id for m in pull.join()] == [high, low]
    assert storage.reads.get_message(later).status == _NEW


def test_a_pull_whose_caller_left_or_whose_topic_is_paused_is_handed_nothing(storage, hub):
    gone = threading.Event()
    pull = Pull(storage, hub, "t.gone", gone=gone).start()
    gone.set()  # the caller cancelled: its taker declines
    [id] = _writer(storage, hub).write([_row("t.gone")], 10)
    assert pull.join() == []
    assert storage.reads.get_message(id).status == _NEW
    storage.topics.save_topic(TopicSettings("t.paused", paused=True), clock.now())
    topics = TopicCache(storage.topics)
    paused = Pull(storage, hub, "t.paused", wait=0.5, paused=lambda: topics.get("t.paused").paused).start()
    [held] = _writer(storage, hub).write([_row("t.paused")], 10)
    assert paused.join() == []
    assert storage.reads.get_message(held).status == _NEW


def test_a_serial_or_flow_limited_pull_never_takes_a_hand_off(storage, hub):
    pull = Pull(storage, hub, "t.limited", quiet=False).start()  # no Quiet: serial or flow-limited
    [id] = _writer(storage, hub).write([_row("t.limited")], 10)
    assert not isinstance(pull.join(), Handed)
    assert pull.locks == 2


def test_a_claimed_pull_past_its_deadline_waits_for_the_transaction_and_returns_its_messages(storage, hub):
    """The lease is written before the COMMIT: a pull that ended at its deadline in between
    would leave a message leased to nobody until its lease ran out."""
    pull = Pull(storage, hub, "t.slow", wait=0.3).start()
    in_tx, go_on = threading.Event(), threading.Event()
    inner = storage.messages

    class SlowCommit:
        def insert_messages(self, rows, now, requests=(), handoff=None, **who):
            class Slow:  # the storage's view of the hand-off, with a pause before the COMMIT
                def begin(self):
                    handoff.begin()

                def takers(self, topic, due):
                    return handoff.takers(topic, due)

                def leased(self, request, messages):
                    handoff.leased(request, messages)
                    in_tx.set()
                    assert go_on.wait(30)

                def committed(self):
                    handoff.committed()
            return inner.insert_messages(rows, now, requests, handoff=Slow(), **who)

    writer = GroupCommitWriter(SlowCommit(), TopicCache(storage.topics), "b:1", hub.notify_commit, pulls=hub)
    produced: list = []
    producer = threading.Thread(target=lambda: produced.append(writer.write([_row("t.slow")], 10)))
    producer.start()
    assert in_tx.wait(10)
    wait_until(lambda: time.monotonic() > pull.deadline + 0.2, 10, what="the pull's deadline to pass")
    assert pull._thread.is_alive() and not pull.result  # held by the claim
    go_on.set()
    producer.join(10)
    [[id]] = produced
    assert [m.id for m in pull.join()] == [id]


def test_a_transaction_that_fails_hands_nothing_and_the_pull_waits_on(storage, hub):
    pull = Pull(storage, hub, "t.fail").start()
    inner = storage.messages

    class Failing:
        def insert_messages(self, rows, now, requests=(), handoff=None, **who):
            handoff.begin()
            assert handoff.takers("t.fail", [(10**9, 0, now)])  # claims the pull
            raise RuntimeError("the database went away")

    with pytest.raises(Exception):
        GroupCommitWriter(Failing(), TopicCache(storage.topics), "b:1", hub.notify_commit, pulls=hub) \
            .write([_row("t.fail")], 10)
    assert pull.waiting() and not pull.result
    [id] = _writer(storage, hub).write([_row("t.fail")], 10)
    assert [m.id for m in pull.join()] == [id]
    assert inner is storage.messages


def test_after_a_hand_off_that_took_everything_the_next_pull_waits_without_a_lock(storage, hub):
    pull = Pull(storage, hub, "t.quiet").start()
    _writer(storage, hub).write([_row("t.quiet")], 10)
    assert isinstance(pull.join(), Handed)
    again = Pull(storage, hub, "t.quiet").start()
    assert again.locks == 0  # its shard stayed quiet: it began with the next due time
    [id] = _writer(storage, hub).write([_row("t.quiet")], 10)
    assert [m.id for m in again.join()] == [id] and again.locks == 0


def test_an_ack_hands_the_step_it_releases_to_the_waiting_pull(storage, hub):
    topic = "t.steps"
    first, second = storage.dependencies.insert_steps(
        [WorkflowStep(_row(topic, 1)), WorkflowStep(_row(topic, 2), after=(0,))], clock.now(), broker="b:1")
    [delivery] = storage.leases.lock_batch(LockRequest(Shard(topic), "c1", 30, clock.now(), limit=10,
                                                       lease_token="t-first"))
    assert delivery.id == first
    pull = Pull(storage, hub, topic).start()
    # One time for the hand-off and the ack, as the service has: the step is released due at the
    # ack's time, which a later clock reading (the next millisecond) would put past the pull's reach.
    now = clock.now()
    handoff = HandOff(hub, now)
    released: dict = {}
    storage.acks.ack([AckItem(first, "t-first", True, workflow=True)], now, "c1", "b:1",
                     lambda t: TopicSettings(t), released, handoff)
    handoff.finish(True)
    found = pull.join()
    assert isinstance(found, Handed) and [m.id for m in found] == [second]
    assert found[0].depends_on == (first,)
    assert storage.reads.get_message(second).status == _RUNNING
    assert handoff.leased_ids() == {second} and released == {topic: {second: 0}}
