"""An operator's edit of messages with dependencies, on every storage: a status set by hand
has the effect on dependents an ack or a cancel would have, a WAITING message can be run
without its dependencies, and no edit can make a step wait for ever or be released twice."""

from __future__ import annotations

import pytest

from tests.conformance.storage_ops import insert, rows
from tests.conformance.test_dependencies import _status, _steps, _submit, _succeed
from tidemq import clock
from tidemq.dependencies import WaitMode
from tidemq.errors import DependencyError
from tidemq.lifecycle import MessageStatus as S
from tidemq_broker.storage import MessageEdit, WorkflowStep


@pytest.fixture
def storage(any_storage):
    return any_storage


def _edit(storage, msg_id, released=None, **values):
    version = storage.reads.get_message(msg_id).version
    return storage.messages.edit_message(msg_id, version, MessageEdit(**values), clock.now(), "ops", sorted(values),
                                         released)


def test_a_dependency_set_to_success_by_hand_releases_what_waits_on_it(storage):
    parent, child = _submit(storage, _steps("t.edit.ok", (), (0,)))
    released: dict[str, dict[int, int]] = {}
    assert _edit(storage, parent, released, status=S.SUCCESS.value).status == S.SUCCESS.value
    assert _status(storage, child) == S.NEW.value
    assert released == {"t.edit.ok": {child: storage.reads.get_message(child).priority}}  # the pulls to wake
    _succeed(storage, "t.edit.ok", [child])


def test_a_dependency_ended_by_hand_names_what_waits_after_complete_as_released(storage):
    [parent] = _submit(storage, _steps("t.edit.end", ()))
    stop, cont = _submit(storage, _steps("t.edit.end.next", (), (), depends_on={0: [parent], 1: [parent]},
                                         modes={1: WaitMode.AFTER_COMPLETE}))
    released: dict[str, dict[int, int]] = {}
    _edit(storage, parent, released, status=S.FAIL.value)
    assert (_status(storage, stop), _status(storage, cont)) == (S.CANCELLED.value, S.NEW.value)
    assert released == {"t.edit.end.next": {cont: storage.reads.get_message(cont).priority}}
    released.clear()
    _edit(storage, cont, released, data='{"edited": 1}')  # an edit that ends nothing releases nothing
    assert released == {}


@pytest.mark.parametrize("ending", [S.FAIL, S.CANCELLED])
def test_a_dependency_set_to_fail_or_cancelled_by_hand_stops_what_waits_on_it(storage, ending):
    parent, child, grandchild = _submit(storage, _steps("t.edit.stop", (), (0,), (1,)))
    _edit(storage, parent, status=ending.value)
    assert [_status(storage, i) for i in (child, grandchild)] == [S.CANCELLED.value] * 2


def test_a_waiting_step_set_to_new_runs_without_its_dependencies_and_is_not_released_again(storage):
    first, second, step = _submit(storage, _steps("t.edit.now", (), (), (0, 1)))
    _edit(storage, step, status=S.NEW.value)
    _succeed(storage, "t.edit.now", [first, second, step])  # all three are due at once
    stored = storage.reads.get_message(step)
    assert stored.status == S.SUCCESS.value and stored.attempt == 1


def test_no_message_can_be_set_waiting_by_hand(storage):
    parent, child = _submit(storage, _steps("t.edit.wait", (), (0,)))
    before = storage.reads.get_message(parent)
    with pytest.raises(ValueError, match="WAITING is set by dependencies only"):
        _edit(storage, parent, status=S.WAITING.value)
    after = storage.reads.get_message(parent)
    assert (after.status, after.version) == (before.status, before.version)
    _edit(storage, child, data='{"edited": 1}')  # a WAITING message's other fields can change
    stored = storage.reads.get_message(child)
    assert (stored.status, stored.data) == (S.WAITING.value, '{"edited": 1}')


def test_a_succeeded_dependency_keeps_its_status_so_a_step_is_not_released_early(storage):
    [first] = insert(storage, "t.edit.first", 1)
    [second] = insert(storage, "t.edit.second", 1)
    [step] = _submit(storage, [WorkflowStep(rows("t.edit.step", 1)[0], (first, second), ())])
    _succeed(storage, "t.edit.first", [first])
    # A second SUCCESS of ``first`` (set by hand, or a run after an edit to NEW) would release
    # the step while ``second`` has not run.
    for status in (S.NEW, S.FAIL):
        with pytest.raises(DependencyError, match=f"message {first} succeeded and others depend on it"):
            _edit(storage, first, status=status.value)
    assert _status(storage, first) == S.SUCCESS.value
    stored = storage.reads.get_message(step)
    assert (stored.status, stored.deps_left) == (S.WAITING.value, 1)


def test_a_succeeded_message_nothing_depends_on_can_still_be_edited(storage):
    [alone] = _submit(storage, _steps("t.edit.alone", ()))
    _succeed(storage, "t.edit.alone", [alone])
    assert _edit(storage, alone, status=S.NEW.value).status == S.NEW.value


def test_a_step_ended_by_hand_counts_in_its_workflow_which_ends_once(storage):
    first, second = _submit(storage, _steps("t.edit.row", (), (0,)))
    _edit(storage, first, status=S.FAIL.value)  # the second is stopped in the same transaction
    assert _status(storage, second) == S.CANCELLED.value
    row = storage.dependencies.workflow(first)
    assert (row.state, row.steps_left, row.steps_failed) == ("FAILED", 0, 2)
    assert row.finished_at is not None
    _edit(storage, first, status=S.SUCCESS.value)  # a finished step: its workflow is not counted again
    again = storage.dependencies.workflow(first)
    assert (again.state, again.steps_left, again.steps_failed, again.finished_at) == \
        ("FAILED", 0, 2, row.finished_at)


def test_the_edges_of_messages_gone_are_swept_and_those_of_stored_ones_kept(storage):
    first, second, third = _submit(storage, _steps("t.edges.gone", (), (0,), (1,)))
    [other] = _submit(storage, _steps("t.edges.kept", (), depends_on={0: [first]}))
    assert storage.messages.cancel([third]) == [True]  # a WAITING step taken back: its row is gone
    assert storage.messages.delete_messages([other]) == 1
    swept, after = 0, 0
    while True:  # two children a look: the sweep goes on from where it stopped
        after, deleted = storage.dependencies.forget_orphan_edges(after, 2)
        swept += deleted
        if after == 0:
            break
    assert swept == 2  # second -> third, first -> other
    assert storage.dependencies.forget_orphan_edges(0, 100) == (second, 0)  # first -> second stays
    _succeed(storage, "t.edges.gone", [first])  # and still releases
    assert _status(storage, second) == S.NEW.value
