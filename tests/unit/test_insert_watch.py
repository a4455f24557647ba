"""The pull hub's watch of messages committed elsewhere, against an in-memory table whose rows
become visible out of id order, as concurrent transactions commit."""

from __future__ import annotations

from datetime import datetime

from tidemq import clock
from tidemq_broker.hints import Arrival
from tidemq_broker.inserts import InsertWatch
from tidemq_broker.storage import RecentInserts


class Table:
    """Committed rows by id; ``recent_inserts`` and ``max_id`` as the storage answers them."""

    def __init__(self, step: int = 1) -> None:
        self.rows: dict[int, tuple[str, datetime, int]] = {}
        self.reads: list[tuple[int, list[int]]] = []
        self.step = step

    def commit(self, id: int, topic: str = "t", when: datetime | None = None, priority: int = 0) -> None:
        self.rows[id] = (topic, when or clock.now(), priority)

    def max_id(self) -> int:
        return max(self.rows, default=0)

    def id_step(self) -> int:
        return self.step

    def recent_inserts(self, after, missing, limit):
        self.reads.append((after, list(missing)))
        found = sorted(id for id in self.rows if id > after or id in missing)[:limit]
        groups: dict[tuple[str, int], tuple[datetime, list[int]]] = {}
        for id in found:
            topic, when, priority = self.rows[id]
            earliest, ids = groups.get((topic, priority), (when, []))
            groups[(topic, priority)] = (min(earliest, when), ids + [id])
        return RecentInserts([(t, p, when, ids) for (t, p), (when, ids) in groups.items()], self.max_id())


def test_the_first_look_wakes_everyone_then_only_new_commits_count():
    table = Table()
    table.commit(1)
    watch = InsertWatch(table)
    assert watch.look() is None
    assert watch.look() == {}
    when = clock.now()
    table.commit(2, "t.a", when)
    assert watch.look() == {"t.a": Arrival(when, frozenset({0}))}
    table.commit(3, "t.a", clock.after(when, 5), priority=7)
    table.commit(4, "t.a", clock.after(when, -5), priority=2)
    assert watch.look() == {"t.a": Arrival(clock.after(when, -5), frozenset({2, 7}))}
    assert watch.look() == {}


def test_an_id_committed_after_a_higher_one_is_still_seen():
    table = Table()
    table.commit(1)
    watch = InsertWatch(table)
    watch.look()
    table.commit(3, "t.late")  # id 2 is held by a transaction that has not committed yet
    assert set(watch.look()) == {"t.late"}
    assert watch.gaps == 1
    assert watch.look() == {}
    table.commit(2, "t.enqueued")
    assert set(watch.look()) == {"t.enqueued"}
    assert watch.gaps == 0 and watch.look() == {}


def test_own_commits_wake_nobody_and_old_gaps_are_forgotten():
    table = Table()
    watch = InsertWatch(table, gap_ttl=0.0)
    watch.look()
    table.commit(1, "t.own")
    watch.committed_here([1])
    table.commit(5, "t.other")
    assert set(watch.look()) == {"t.other"}  # 1 was this broker's own: its waiters were told
    assert watch.look() == {} and watch.gaps == 0  # 2..4 never committed: forgotten at once here
    table.commit(3)
    assert watch.look() == {}  # too late for the watch; the hub's earliest-due probe covers it


def test_a_burst_larger_than_one_statement_is_read_in_several():
    table = Table()
    watch = InsertWatch(table, limit=10)
    watch.look()
    first = clock.now()
    for id in range(1, 26):
        table.commit(id, "t.burst", clock.after(first, id), priority=id % 3)
    assert watch.look() == {"t.burst": Arrival(clock.after(first, 1), frozenset({0, 1, 2}))}
    assert [after for after, _ in table.reads[-3:]] == [0, 10, 20]
    assert watch.gaps == 0  # the ids above a full statement's last one were read next, not missed
    assert watch.look() == {}
    assert table.reads[-1] == (25, [])


def test_a_burst_larger_than_a_look_reads_wakes_everyone_and_skips_to_the_newest():
    table = Table()
    watch = InsertWatch(table, limit=10, pages=2)
    watch.look()
    for id in range(1, 26):
        table.commit(id)
    assert watch.look() is None
    assert watch.look() == {}
    assert table.reads[-1] == (25, [])


def test_on_a_cluster_only_ids_a_seen_writer_could_hand_out_are_gaps():
    table = Table(step=3)  # three Galera nodes; one of them (ids 1, 4, 7, ...) takes the writes
    table.commit(1)
    watch = InsertWatch(table)
    watch.look()
    for id in (4, 7, 10):
        table.commit(id)
    watch.look()
    assert watch.gaps == 0  # 2, 3, 5, 6, 8, 9 belong to nodes that write nothing: never read again
    table.commit(16, "t.next")  # 13 is held by an open transaction on the writer
    assert set(watch.look()) == {"t.next"}
    assert watch.gaps == 1 and table.reads[-1][1] == []  # this look read no gap; the next reads 13
    watch.look()
    assert table.reads[-1][1] == [13]
    table.commit(13, "t.late")
    assert set(watch.look()) == {"t.late"} and watch.gaps == 0


def test_ids_that_go_backwards_restart_the_watch_from_the_top():
    table = Table()
    for id in range(1, 1001):
        table.commit(id)
    watch = InsertWatch(table)
    watch.look()
    table.commit(1001)
    table.commit(1003, "t.gap")  # 1002 is a gap the watch will remember
    watch.look()
    assert watch.gaps == 1
    table.rows.clear()  # TRUNCATE: the counter starts again at 1
    table.commit(1, "t.new")
    assert watch.look() is None  # every waiting pull looks again
    assert watch.gaps == 0
    table.commit(2, "t.next")
    assert set(watch.look()) == {"t.next"}  # and the walk goes on from the new top
    assert table.reads[-1] == (1, [])
