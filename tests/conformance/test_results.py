"""Results, progress and cancelling running work, on every storage (memory, SQLite, MariaDB,
Galera): a result commits with its status, an error with its failure, progress only under the
lease, a cancel request marks a running message, and CANCELLED is final."""

from __future__ import annotations

import json

import pytest

from tests.conformance.storage_ops import ack, insert, lock
from tidemq import clock, trace
from tidemq.lifecycle import MessageStatus as S
from tidemq_broker.storage import AckItem, AckOutcome, LockRequest, Shard, TopicSettings


@pytest.fixture
def storage(any_storage):
    return any_storage


def _events(storage, msg_id):
    return [entry["event"] for entry in trace.parse(storage.reads.get_message(msg_id).trace)]


def test_a_success_stores_each_items_result_with_its_status_on_both_ack_paths(storage):
    ids = insert(storage, "t.res", 4)
    batch = lock(storage, "t.res")
    # All successes of one lease: the fast path, one statement for differing results.
    fast = [AckItem(m.id, m.lease_token, True, result=json.dumps({"n": m.id})) for m in batch[:2]]
    fast.append(AckItem(batch[2].id, batch[2].lease_token, True))
    assert ack(storage, fast) == [AckOutcome.APPLIED] * 3
    # A success beside a failure: the exact path.
    error = json.dumps({"type": "builtins.ValueError", "message": "bad", "traceback": "..."})
    mixed = [AckItem(batch[3].id, batch[3].lease_token, True, result='"last"'),
             AckItem(batch[0].id, batch[0].lease_token, False, "late", result=error)]
    assert ack(storage, mixed) == [AckOutcome.APPLIED, AckOutcome.STALE]
    results = {r.id: r for r in storage.reads.get_results(ids)}
    assert [results[i].result for i in ids] == [json.dumps({"n": ids[0]}), json.dumps({"n": ids[1]}), None, '"last"']
    assert {r.status for r in results.values()} == {S.SUCCESS.value}
    assert all(r.finish_time is not None and r.topic == "t.res" for r in results.values())


def test_a_failure_keeps_its_error_on_a_retry_and_on_fail(storage):
    [retried, failed] = insert(storage, "t.err", 2, retry=1)
    [a, b] = lock(storage, "t.err")
    error = json.dumps({"type": "app.Boom", "message": "boom", "traceback": "tb"})
    assert ack(storage, [AckItem(a.id, a.lease_token, False, "boom", result=error)]) == [AckOutcome.APPLIED]
    stored = storage.reads.get_message(retried)
    assert (stored.status, stored.result) == (S.NEW.value, error)
    assert ack(storage, [AckItem(b.id, b.lease_token, False, "boom", result=error)]) == [AckOutcome.APPLIED]
    assert storage.reads.get_message(failed).result == error


def test_a_result_at_the_size_limit_round_trips_intact(storage):
    [msg_id] = insert(storage, "t.big", 1)
    [msg] = lock(storage, "t.big")
    big = json.dumps("é" + "x" * ((1 << 20) - 10))
    assert len(big.encode()) <= 1 << 20
    assert ack(storage, [AckItem(msg.id, msg.lease_token, True, result=big)]) == [AckOutcome.APPLIED]
    [stored] = storage.reads.get_results([msg_id])
    assert stored.result == big


def test_progress_is_written_only_under_the_lease_without_a_new_version(storage):
    [msg_id, other] = insert(storage, "t.prog", 2)
    [msg, second] = lock(storage, "t.prog")
    version = storage.reads.get_message(msg_id).version
    report = json.dumps({"done": 3, "total": 10, "note": "rows", "at": 1})
    assert storage.leases.report_progress([(msg.id, msg.lease_token, report), (msg.id, "f" * 32, "{}"),
                                           (10 ** 12, msg.lease_token, "{}")], clock.now()) == [True, False, False]
    stored = storage.reads.get_message(msg_id)
    assert (stored.progress, stored.version) == (report, version)
    assert _events(storage, msg_id) == ["PRODUCED", "LOCKED"]
    assert ack(storage, [AckItem(second.id, second.lease_token, True)]) == [AckOutcome.APPLIED]
    assert storage.leases.report_progress([(second.id, second.lease_token, report)], clock.now()) == [False]
    assert storage.reads.get_message(other).progress is None


def test_a_running_cancel_deletes_pending_marks_running_once_in_one_call_and_leaves_the_finished(storage):
    [running, pending] = insert(storage, "t.cancel", 2)
    [done, other_running] = insert(storage, "t.cancel.other", 2)
    [msg] = lock(storage, "t.cancel", limit=1)
    [finished, other] = lock(storage, "t.cancel.other")
    ack(storage, [AckItem(done, finished.lease_token, True)])
    assert (msg.id, finished.id) == (running, done)
    assert storage.leases.cancels_requested([(running, msg.lease_token)]) == [False]
    # Without running_at a running message is left alone, and says so.
    assert storage.messages.cancel([running, other_running]) == [False, False]
    assert not storage.reads.get_message(running).cancel_requested
    now = clock.now()
    topics: set[str] = set()
    assert storage.messages.cancel([running, pending, done, 10 ** 12], None, now, topics,
                                   broker="b1") == [True, True, False, False]
    assert topics == {"t.cancel"}  # the marked one's topic only: the broker signals its workers
    assert storage.reads.get_message(pending) is None
    assert storage.messages.cancel([running], None, now, broker="b1") == [True]  # asked again: no new line
    nothing: set[str] = set()
    assert storage.messages.cancel([done], None, now, nothing, broker="b1") == [False] and nothing == set()
    stored = storage.reads.get_message(running)
    assert (stored.status, stored.cancel_requested) == (S.RUNNING.value, True)
    assert _events(storage, running).count("CANCEL_REQUESTED") == 1 and "broker=b1" in stored.trace
    assert storage.reads.get_message(done).cancel_requested is False
    assert storage.reads.get_message(other_running).cancel_requested is False
    assert storage.leases.cancels_requested([(running, msg.lease_token), (running, "f" * 32),
                                             (other_running, other.lease_token)]) == [True, False, False]


def test_a_cancelled_ack_ends_cancelled_and_a_late_ack_of_any_outcome_is_stale(storage):
    [msg_id] = insert(storage, "t.stop", 1)
    [msg] = lock(storage, "t.stop")
    storage.messages.cancel([msg_id], None, clock.now(), broker="b1")
    stop = AckItem(msg_id, msg.lease_token, False, "cancelled", cancelled=True)
    assert ack(storage, [stop]) == [AckOutcome.APPLIED]
    stored = storage.reads.get_message(msg_id)
    assert (stored.status, stored.lease_token) == (S.CANCELLED.value, msg.lease_token)
    assert stored.finish_time is not None and stored.lease_expire is None
    assert ack(storage, [stop]) == [AckOutcome.APPLIED]  # a repeat of the recorded ack
    assert ack(storage, [AckItem(msg_id, msg.lease_token, True, result="1")]) == [AckOutcome.STALE]
    assert storage.reads.get_message(msg_id).status == S.CANCELLED.value
    assert storage.leases.cancels_requested([(msg_id, msg.lease_token)]) == [False]


def test_completion_wins_a_race_with_a_cancel_request_but_a_failure_after_it_is_not_retried(storage):
    [done, failing] = insert(storage, "t.race", 2, retry=5)
    [a, b] = lock(storage, "t.race")
    storage.messages.cancel([done, failing], None, clock.now(), broker="b1")
    assert ack(storage, [AckItem(a.id, a.lease_token, True, result='{"ok": 1}'),
                         AckItem(b.id, b.lease_token, False, "stopped")]) == [AckOutcome.APPLIED] * 2
    assert storage.reads.get_message(done).status == S.SUCCESS.value
    assert storage.reads.get_message(done).result == '{"ok": 1}'
    assert storage.reads.get_message(failing).status == S.CANCELLED.value


def test_a_cancel_requested_message_whose_lease_runs_out_ends_cancelled_and_is_not_leased_again(storage):
    [msg_id, other] = insert(storage, "t.killed", 2)
    [msg, plain] = lock(storage, "t.killed", ttr=1, consumer="worker-k")
    storage.messages.cancel([msg_id], None, clock.now(), broker="b1")
    by_topic: dict[str, int] = {}
    assert storage.leases.expire_leases(clock.after(clock.now(), 2), 100, "b1", lambda topic: 10, by_topic) == 2
    assert by_topic == {"t.killed": 2}
    stored = storage.reads.get_message(msg_id)
    assert stored.status == S.CANCELLED.value and "lost_by=worker-k" in stored.trace
    assert storage.reads.get_message(other).status == S.NEW.value
    assert [m.id for m in lock(storage, "t.killed")] == [other]
    assert ack(storage, [AckItem(msg_id, msg.lease_token, True)]) == [AckOutcome.STALE]


def test_a_released_lease_of_a_cancel_requested_message_ends_cancelled(storage):
    ids = insert(storage, "t.rel", 2)
    token = "cd" * 16
    storage.leases.lock_batch(LockRequest(Shard("t.rel"), "c1", 30, clock.now(), limit=2, lease_token=token))
    storage.messages.cancel([ids[0]], None, clock.now(), broker="b1")
    assert storage.leases.release(token, clock.now()) == 2
    assert [storage.reads.get_message(i).status for i in ids] == [S.CANCELLED.value, S.NEW.value]


def test_the_probe_names_final_and_gone_messages_and_results_skip_unknown_ids(storage):
    ids = insert(storage, "t.probe", 3)
    [msg] = lock(storage, "t.probe", limit=1)
    unknown = 10 ** 12
    assert storage.probes.finished(ids + [unknown]) == [unknown]
    ack(storage, [AckItem(msg.id, msg.lease_token, True, result="7")])
    assert storage.messages.cancel([ids[2]]) == [True]
    assert storage.probes.finished(ids + [unknown]) == [ids[0], ids[2], unknown]
    assert [(r.id, r.status, r.result) for r in storage.reads.get_results([unknown, ids[1], ids[0]])] == \
        [(ids[0], S.SUCCESS.value, "7"), (ids[1], S.NEW.value, None)]
    assert storage.reads.get_results([]) == [] and storage.probes.finished([]) == []


def test_result_retention_clears_results_and_progress_of_old_finished_messages_only(storage):
    [old, fresh, running, other_topic] = insert(storage, "t.keep", 3) + insert(storage, "t.keep2", 1)
    batch = lock(storage, "t.keep")
    [o] = lock(storage, "t.keep2")
    by_id = {m.id: m for m in batch}
    storage.leases.report_progress([(running, by_id[running].lease_token, '{"done": 1}')], clock.now())
    ack(storage, [AckItem(old, by_id[old].lease_token, True, result='"a"'),
                  AckItem(o.id, o.lease_token, True, result='"c"')])
    cutoff = clock.after(clock.now(), 0.05)
    later = clock.after(cutoff, 1)
    ack_at = storage.acks.ack([AckItem(fresh, by_id[fresh].lease_token, True, result='"b"')], later, "c1", "b1",
                              lambda name: None)
    assert ack_at == [AckOutcome.APPLIED]
    version = storage.reads.get_message(old).version
    assert storage.messages.forget_results("t.keep", cutoff, 100) == 1
    assert storage.messages.forget_results("t.keep", cutoff, 100) == 0
    stored = storage.reads.get_message(old)
    assert (stored.status, stored.result, stored.progress, stored.version) == (S.SUCCESS.value, None, None, version)
    assert storage.reads.get_message(fresh).result == '"b"'
    assert storage.reads.get_message(running).progress == '{"done": 1}'
    assert storage.reads.get_message(other_topic).result == '"c"'


def test_topic_result_retention_is_a_stored_setting(storage):
    storage.topics.save_topic(TopicSettings("t.ret", result_retention_seconds=600), clock.now())
    [saved] = [t for t in storage.topics.list_topics() if t.name == "t.ret"]
    assert saved.result_retention_seconds == 600
    storage.topics.ensure_topics(["t.ret.default"], clock.now())
    [default] = [t for t in storage.topics.list_topics() if t.name == "t.ret.default"]
    assert default.result_retention_seconds is None


def test_the_consoles_retained_results_are_finished_messages_with_a_result_newest_first_in_pages(storage):
    ids = insert(storage, "t.page", 6) + insert(storage, "t.page.other", 1)
    leased = {m.id: m for m in lock(storage, "t.page") + lock(storage, "t.page.other")}
    storage.messages.cancel([ids[4]], None, clock.now(), broker="b1")
    error = json.dumps({"type": "E", "message": "m", "traceback": ""})
    ack(storage, [AckItem(ids[0], leased[ids[0]].lease_token, True, result='"a"'),
                  AckItem(ids[1], leased[ids[1]].lease_token, True),  # no result: not listed
                  AckItem(ids[2], leased[ids[2]].lease_token, False, "m", result=error),
                  AckItem(ids[3], leased[ids[3]].lease_token, True, result='"d"'),
                  AckItem(ids[4], leased[ids[4]].lease_token, False, "stop", result=error, cancelled=True),
                  AckItem(ids[6], leased[ids[6]].lease_token, True, result='"other"')])
    first = storage.console.results_page("t.page", 2)
    assert [(r.id, r.status) for r in first] == [(ids[3], "SUCCESS"), (ids[2], "FAIL")]
    rest = storage.console.results_page("t.page", 10, before_id=first[-1].id)
    assert [(r.id, r.result) for r in rest] == [(ids[0], '"a"')]  # the CANCELLED ack stored no result
    assert storage.console.results_page("t.none", 10) == []


def test_a_result_at_the_size_limit_beside_a_small_one_in_one_ack(storage):
    # Two rows, two values: the one statement picks each row's own, the large one intact.
    ids = insert(storage, "t.big2", 2)
    batch = lock(storage, "t.big2")
    big = json.dumps("ü" + "y" * ((1 << 20) - 10))
    assert len(big.encode()) <= 1 << 20
    results = {batch[0].id: big, batch[1].id: '{"small": 1}'}
    assert ack(storage, [AckItem(m.id, m.lease_token, True, result=results[m.id]) for m in batch]) \
        == [AckOutcome.APPLIED] * 2
    assert {r.id: r.result for r in storage.reads.get_results(ids)} == results


def test_an_ack_of_large_results_is_split_whatever_its_first_item_carries(storage):
    # A SQL storage keeps each UPDATE of results to a few MiB (the server refuses a statement
    # over its max_allowed_packet): every item's result counts, also when the first has none.
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    updates: list[int] = []

    def count(conn, cursor, statement, parameters, *args):
        values = parameters.values() if isinstance(parameters, dict) else parameters or ()
        large = sum(1 for value in values if isinstance(value, str) and len(value) > 1_000_000)
        if large and statement.lstrip().upper().startswith("UPDATE"):
            updates.append(large)

    ids = insert(storage, "t.large", 9)
    batch = lock(storage, "t.large", 9)
    results = {m.id: json.dumps("x" * (1 << 20)) for m in batch}
    results[batch[0].id] = None
    event.listen(Engine, "before_cursor_execute", count)
    try:
        assert ack(storage, [AckItem(m.id, m.lease_token, True, result=results[m.id]) for m in batch]) \
            == [AckOutcome.APPLIED] * 9
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert {r.id: r.result for r in storage.reads.get_results(ids)} == {i: results[i] for i in ids}
    if updates:  # a SQL storage: 8 MiB of results in more than one statement
        assert len(updates) >= 2, updates


def test_many_differing_results_in_one_ack_each_land_on_their_own_row(storage):
    # 700 items: a statement sized for 1,024 (nulls fill it; never picked), with
    # text that is not ASCII, a result that is null and one that is empty JSON text.
    ids = insert(storage, "t.many", 700)
    batch = lock(storage, "t.many", 700)
    results = {m.id: json.dumps({"n": m.id, "s": "é" * (m.id % 7)}) for m in batch}
    results[batch[10].id] = None
    results[batch[20].id] = '""'
    items = [AckItem(m.id, m.lease_token, True, result=results[m.id]) for m in reversed(batch)]
    assert ack(storage, items) == [AckOutcome.APPLIED] * 700
    stored = {r.id: r.result for r in storage.reads.get_results(ids)}
    assert stored == {i: results[i] for i in ids}
