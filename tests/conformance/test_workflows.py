"""A workflow's row on every storage: created by a submission of steps, lowered in the
transaction of each step's end (ack, lease expiry, cancel, delete, a dependency's failure) and
ended once, by the transaction of its last step, even when the last two end at once; and
cancelling a workflow whole."""

from __future__ import annotations

import threading

import pytest

from tests.conformance.storage_ops import ack, insert, lock, rows
from tidemq import clock
from tidemq.dependencies import WaitMode
from tidemq.lifecycle import MessageStatus as S
from tidemq_broker.storage import AckItem, AckOutcome, WorkflowStep


@pytest.fixture
def storage(any_storage):
    return any_storage


@pytest.fixture
def ended(storage):
    """Every {state: n} the storage reports, after the commits that ended workflows."""
    seen: list[dict[str, int]] = []
    storage.dependencies.watch_workflows(seen.append)
    return seen


def _submit(storage, topic, *after, depends_on=None, modes=None):
    made = rows(topic, len(after))
    steps = [WorkflowStep(row, tuple((depends_on or {}).get(i, ())), tuple(waits), (modes or {}).get(i, 0))
             for i, (row, waits) in enumerate(zip(made, after))]
    return storage.dependencies.insert_steps(steps, clock.now(), broker="b1")


def _row(storage, workflow_id):
    found = storage.dependencies.workflow(workflow_id)
    return (found.state, found.steps_total, found.steps_left, found.steps_failed)


def test_a_submission_creates_its_row_and_the_last_success_ends_it(storage, ended):
    [outside] = insert(storage, "t.wf.outside", 1)
    ids = _submit(storage, "t.wf", (), (0,), depends_on={0: [outside]})
    row = storage.dependencies.workflow(ids[0])
    # The stored message waited on joined the workflow: it ends only once that one has too.
    assert (row.id, row.policy, row.state, row.steps_total, row.steps_left, row.steps_failed) == \
        (ids[0], "stop", "RUNNING", 3, 3, 0)
    assert row.created_at is not None and row.finished_at is None
    for topic, expected in (("t.wf.outside", [outside]), ("t.wf", [ids[0]]), ("t.wf", [ids[1]])):
        [leased] = lock(storage, topic)
        assert leased.id in expected
        assert ack(storage, [AckItem(leased.id, leased.lease_token, True)]) == [AckOutcome.APPLIED]
    assert _row(storage, ids[0]) == ("SUCCEEDED", 3, 0, 0)
    assert storage.dependencies.workflow(ids[0]).finished_at is not None
    assert ended == [{"SUCCEEDED": 1}]
    assert storage.dependencies.workflow(ids[0] + 10 ** 9) is None


def test_a_failure_under_stop_ends_the_workflow_failed_with_what_it_cancelled(storage, ended):
    root, child, free = _submit(storage, "t.wf.stop", (), (0,), ())
    batch = {m.id: m for m in lock(storage, "t.wf.stop")}
    ack(storage, [AckItem(root, batch[root].lease_token, False, "boom")])
    assert _row(storage, root) == ("RUNNING", 3, 1, 2)  # the root and the child it cancelled
    ack(storage, [AckItem(free, batch[free].lease_token, True)])
    assert _row(storage, root) == ("FAILED", 3, 0, 2)
    assert ended == [{"FAILED": 1}]


def test_policy_continue_and_a_callback_not_needed(storage, ended):
    a, b, on_complete, on_failure = _submit(storage, "t.wf.cont", (), (), (0, 1), (0, 1),
                                            modes={2: WaitMode.AFTER_COMPLETE, 3: WaitMode.AFTER_FAILURE})
    assert storage.dependencies.workflow(a).policy == "continue"
    batch = {m.id: m for m in lock(storage, "t.wf.cont")}
    ack(storage, [AckItem(i, batch[i].lease_token, True) for i in (a, b)])
    # The callback for failures is not needed: cancelled, but the workflow did not fail for it.
    assert _row(storage, a) == ("RUNNING", 4, 1, 0)
    [leased] = lock(storage, "t.wf.cont")
    assert leased.id == on_complete
    ack(storage, [AckItem(on_complete, leased.lease_token, True)])
    assert _row(storage, a) == ("SUCCEEDED", 4, 0, 0)


def test_lease_expiry_cancel_and_delete_count_as_ends(storage, ended):
    poison, waits, plain = _submit(storage, "t.wf.ends", (), (0,), ())
    assert sorted(m.id for m in lock(storage, "t.wf.ends", ttr=1)) == [poison, plain]
    later = clock.after(clock.now(), 5)
    assert storage.leases.expire_leases(later, 100, "b1", lambda topic: 1) == 2
    # Both poison steps FAIL (at most one delivery), and the step waiting on one is cancelled.
    assert _row(storage, poison) == ("FAILED", 3, 0, 3)
    assert ended == [{"FAILED": 1}]
    one, two = _submit(storage, "t.wf.gone", (), ())
    assert storage.messages.cancel([one]) == [True]
    assert _row(storage, one) == ("RUNNING", 2, 1, 1)
    assert storage.messages.delete_messages([two]) == 1
    assert _row(storage, one) == ("FAILED", 2, 0, 2)
    assert ended == [{"FAILED": 1}, {"FAILED": 1}]


def test_the_last_two_steps_acked_at_once_end_the_workflow_once(storage, ended):
    ids = _submit(storage, "t.wf.race", (), (), (), ())
    batch = {m.id: m for m in lock(storage, "t.wf.race")}
    ack(storage, [AckItem(i, batch[i].lease_token, True) for i in ids[:2]])
    start = threading.Barrier(2)
    outcomes = []

    def finish(step):
        start.wait()
        outcomes.append(ack(storage, [AckItem(step, batch[step].lease_token, True)]))

    threads = [threading.Thread(target=finish, args=(step,)) for step in ids[2:]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == [[AckOutcome.APPLIED]] * 2
    assert _row(storage, ids[0]) == ("SUCCEEDED", 4, 0, 0)
    assert ended == [{"SUCCEEDED": 1}]


def test_cancelling_a_workflow_removes_what_has_not_run_and_marks_what_runs(storage, ended):
    [outside_parent] = insert(storage, "t.wf.cancel.other", 1)
    first, second, third = _submit(storage, "t.wf.cancel", (), (0,), (1,))
    other = _submit(storage, "t.wf.cancel.other", (), (0,), depends_on={0: [outside_parent]})
    [leased] = lock(storage, "t.wf.cancel")
    assert leased.id == first
    unmarked: set[str] = set()
    assert storage.dependencies.cancel_workflows([first], False, clock.now(), unmarked, broker="b1") == [(2, 0)]
    assert unmarked == set()  # nothing marked: no topic to signal
    assert [storage.reads.get_message(i) for i in (second, third)] == [None, None]
    assert _status(storage, first) == S.RUNNING.value and not storage.reads.get_message(first).cancel_requested
    assert _row(storage, first) == ("CANCELLED", 3, 1, 2)
    assert ended == []
    # running=True marks the running step; its end then ends the workflow, CANCELLED.
    marked: set[str] = set()
    assert storage.dependencies.cancel_workflows([first], True, clock.now(), marked, user="ada") == [(0, 1)]
    assert marked == {"t.wf.cancel"}
    marked_step = storage.reads.get_message(first)
    assert marked_step.cancel_requested
    assert "CANCEL_REQUESTED" in marked_step.trace and "user=ada" in marked_step.trace  # who cancelled
    assert storage.dependencies.cancel_workflows([first], True, clock.now(), broker="b1") == [(0, 0)]  # marked before
    ack(storage, [AckItem(first, leased.lease_token, False, "stopped", cancelled=True)])
    assert _row(storage, first) == ("CANCELLED", 3, 0, 3)
    assert ended == [{"CANCELLED": 1}]
    # Another workflow is untouched; an unknown id cancels nothing.
    assert [_status(storage, i) for i in other] == [S.WAITING.value, S.WAITING.value]
    assert storage.dependencies.cancel_workflows([other[0] + 10 ** 9], True, clock.now(), broker="b1") == [(0, 0)]
    assert storage.dependencies.workflow_topics([first]) == {"t.wf.cancel"}
    assert storage.dependencies.workflow_topics([first, other[0]]) == {"t.wf.cancel", "t.wf.cancel.other"}


def test_cancelling_a_workflow_stops_what_waits_on_it_from_another(storage):
    first, second = _submit(storage, "t.wf.cross", (), (0,))
    stop, cont = _submit(storage, "t.wf.cross2", (), (), depends_on={0: [second], 1: [second]},
                         modes={1: WaitMode.AFTER_COMPLETE})
    released: dict[str, dict[int, int]] = {}
    assert storage.dependencies.cancel_workflows([first], False, clock.now(), None, released, broker="b1") == [(2, 0)]
    assert _status(storage, stop) == S.CANCELLED.value
    stored = storage.reads.get_message(cont)
    assert (stored.status, stored.deps_failed) == (S.NEW.value, 1)
    assert released == {"t.wf.cross2": {cont: stored.priority}}  # due now: the broker wakes its pulls
    assert _row(storage, stop) == ("RUNNING", 2, 1, 1)


def _status(storage, msg_id):
    return storage.reads.get_message(msg_id).status
