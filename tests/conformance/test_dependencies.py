"""Dependencies between messages, on every storage (memory, SQLite, MariaDB, Galera): a step
waits (WAITING) until its dependencies succeed and is released in the transaction of the last
SUCCESS, once; a submission with an unknown id, a cycle or too many steps stores nothing; a
dependency that fails cancels what waits on it (policy stop), or counts as ended for a step
waiting after complete or after failure (policy continue, batches' callbacks)."""

from __future__ import annotations

import threading

import pytest

from tests.conformance.storage_ops import ack, insert, lock, rows
from tidemq import clock, trace
from tidemq.dependencies import WaitMode
from tidemq.errors import (DependencyCycleError, DependencyError, MalformedRequestError, UnknownDependencyError,
                           WorkflowTooLargeError)
from tidemq.lifecycle import MessageStatus as S
from tidemq.limits import MAX_DEPENDENCIES, MAX_WORKFLOW_STEPS
from tidemq_broker.storage import AckItem, AckOutcome, LockRequest, Shard, TopicSettings, WorkflowStep


@pytest.fixture
def storage(any_storage):
    return any_storage


def _steps(topic, *after, depends_on=None, delay=0.0, modes=None):
    """One step per entry of ``after`` (the positions it waits on); ``depends_on`` maps a
    position to stored ids it waits on, ``modes`` a position to its wait mode."""
    made = rows(topic, len(after), delay=delay)
    return [WorkflowStep(row, tuple((depends_on or {}).get(i, ())), tuple(waits), (modes or {}).get(i, 0))
            for i, (row, waits) in enumerate(zip(made, after))]


def _submit(storage, steps):
    return storage.dependencies.insert_steps(steps, clock.now(), broker="b1")


def _status(storage, msg_id):
    return storage.reads.get_message(msg_id).status


def _events(storage, msg_id):
    return [entry for entry in trace.parse(storage.reads.get_message(msg_id).trace)]


def _succeed(storage, topic, expected):
    """Lease what is due of ``topic``, check it is exactly ``expected``, and ack it SUCCESS."""
    batch = lock(storage, topic)
    assert sorted(m.id for m in batch) == sorted(expected)
    assert ack(storage, [AckItem(m.id, m.lease_token, True) for m in batch]) == [AckOutcome.APPLIED] * len(batch)


def _count(storage, topic):
    return storage.counts.count_by_status(topic).get(topic, {})


def test_a_chain_of_three_is_released_one_step_at_a_time(storage):
    a, b, c = _submit(storage, _steps("t.chain", (), (0,), (1,)))
    assert [_status(storage, i) for i in (a, b, c)] == [S.NEW.value, S.WAITING.value, S.WAITING.value]
    assert storage.reads.get_message(c).deps_left == 1
    assert {storage.reads.get_message(i).workflow_id for i in (a, b, c)} == {a}
    _succeed(storage, "t.chain", [a])
    assert [_status(storage, i) for i in (b, c)] == [S.NEW.value, S.WAITING.value]
    [met] = [e for e in _events(storage, b) if e["event"] == "DEPENDENCY_MET"]
    assert met["dependency"] == str(a)
    _succeed(storage, "t.chain", [b])
    assert _status(storage, c) == S.NEW.value
    _succeed(storage, "t.chain", [c])
    assert _count(storage, "t.chain") == {S.SUCCESS.value: 3}


def test_a_fan_in_of_five_is_released_once_after_the_last(storage):
    ids = _submit(storage, _steps("t.fan", (), (), (), (), (), (0, 1, 2, 3, 4)))
    parents, child = ids[:5], ids[5]
    batch = {m.id: m for m in lock(storage, "t.fan")}
    assert sorted(batch) == sorted(parents)  # the waiting step is not leased
    for n, parent in enumerate(parents[:4]):
        assert ack(storage, [AckItem(parent, batch[parent].lease_token, True)]) == [AckOutcome.APPLIED]
        stored = storage.reads.get_message(child)
        assert (stored.status, stored.deps_left) == (S.WAITING.value, 4 - n)
    # The last one beside a failure of a stale lease: the ack's exact path releases too, and
    # says which messages of which topics are due.
    last, released = parents[4], {}
    items = [AckItem(last, batch[last].lease_token, True, result='"done"'),
             AckItem(parents[0], "0" * 32, False, "late")]
    assert storage.acks.ack(items, clock.now(), "c1", "b1", TopicSettings, released) == \
        [AckOutcome.APPLIED, AckOutcome.STALE]
    assert released == {"t.fan": {child: 0}}
    assert _status(storage, child) == S.NEW.value
    assert [e["dependency"] for e in _events(storage, child) if e["event"] == "DEPENDENCY_MET"] == [str(last)]
    assert [m.id for m in lock(storage, "t.fan")] == [child]


def test_the_last_two_members_of_a_fan_in_acked_at_once_release_it_once(storage):
    ids = _submit(storage, _steps("t.race", (), (), (), (), (), (0, 1, 2, 3, 4)))
    batch = {m.id: m for m in lock(storage, "t.race")}
    for parent in ids[:3]:
        ack(storage, [AckItem(parent, batch[parent].lease_token, True)])
    start = threading.Barrier(2)
    outcomes = []

    def finish(parent):
        start.wait()
        outcomes.append(ack(storage, [AckItem(parent, batch[parent].lease_token, True)]))

    threads = [threading.Thread(target=finish, args=(parent,)) for parent in ids[3:5]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == [[AckOutcome.APPLIED]] * 2
    stored = storage.reads.get_message(ids[5])
    assert (stored.status, stored.deps_left) == (S.NEW.value, 0)
    assert len([e for e in _events(storage, ids[5]) if e["event"] == "DEPENDENCY_MET"]) == 1


def test_a_dependency_on_an_unknown_id_stores_nothing(storage):
    [known] = insert(storage, "t.unknown", 1)
    unknown = known + 10 ** 9
    before = _count(storage, "t.unknown")
    with pytest.raises(UnknownDependencyError, match=str(unknown)) as err:
        _submit(storage, _steps("t.unknown", (), (0,), depends_on={1: [known, unknown]}))
    assert "MAX" not in str(err.value)
    assert _count(storage, "t.unknown") == before == {S.NEW.value: 1}
    assert storage.reads.get_message(known).workflow_id is None


def test_a_cycle_is_refused_and_nothing_is_stored(storage):
    with pytest.raises(DependencyCycleError, match="step 1 -> step 2 -> step 1"):
        _submit(storage, _steps("t.cycle", (), (2,), (1,)))
    with pytest.raises(DependencyCycleError, match="step 0 waits on itself"):
        _submit(storage, _steps("t.cycle", (0,)))
    with pytest.raises(DependencyError, match="steps 0 to 1"):
        _submit(storage, _steps("t.cycle", (), (5,)))
    assert _count(storage, "t.cycle") == {}


def test_a_submission_over_the_limit_is_refused_naming_it(storage):
    row = rows("t.big", 1)[0]
    with pytest.raises(WorkflowTooLargeError, match="MAX_WORKFLOW_STEPS"):
        _submit(storage, [WorkflowStep(row)] * (MAX_WORKFLOW_STEPS + 1))
    assert _count(storage, "t.big") == {}


def test_a_fan_in_wider_than_max_dependencies_in_one_submission_is_released_once_by_its_last_member(storage):
    # A step waits on up to MAX_DEPENDENCIES stored messages, but on any number of the steps
    # of its own submission (a chord's body after every member).
    n = MAX_DEPENDENCIES + 200
    ids = _submit(storage, _steps("t.wide", *([()] * n), tuple(range(n))))
    body = ids[-1]
    assert (_status(storage, body), storage.reads.get_message(body).deps_left) == (S.WAITING.value, n)
    assert storage.dependencies.workflow(ids[0]).steps_total == n + 1
    leased = []
    while len(leased) < n:
        leased += lock(storage, "t.wide", limit=500)
    assert sorted(m.id for m in leased) == ids[:-1]
    released: dict[str, dict[int, int]] = {}
    for start in range(0, n - 1, 300):
        batch = leased[start : min(start + 300, n - 1)]
        storage.acks.ack([AckItem(m.id, m.lease_token, True) for m in batch], clock.now(), "c1", "b1", TopicSettings,
                         released)
    assert (released, storage.reads.get_message(body).deps_left) == ({}, 1)
    storage.acks.ack([AckItem(leased[-1].id, leased[-1].lease_token, True)], clock.now(), "c1", "b1", TopicSettings,
                     released)
    assert released == {"t.wide": {body: 0}} and _status(storage, body) == S.NEW.value
    [delivery] = lock(storage, "t.wide")
    assert delivery.id == body and delivery.depends_on == tuple(ids[:-1])


def test_a_dependency_that_already_succeeded_counts_as_met(storage):
    ids = insert(storage, "t.met", 2)
    [first, second] = lock(storage, "t.met", limit=2)
    ack(storage, [AckItem(first.id, first.lease_token, True)])
    succeeded, other = first.id, second.id  # the other one is still running
    assert sorted(ids) == sorted([succeeded, other])
    now_due, waits = _submit(storage, _steps("t.met", (), (), depends_on={0: [succeeded], 1: [succeeded, other]}))
    assert (_status(storage, now_due), storage.reads.get_message(now_due).deps_left) == (S.NEW.value, 0)
    assert (_status(storage, waits), storage.reads.get_message(waits).deps_left) == (S.WAITING.value, 1)
    # The message waited on now belongs to the workflow (its ack looks for dependents); the one
    # that already finished is left as it was.
    assert storage.reads.get_message(other).workflow_id == now_due
    assert storage.reads.get_message(succeeded).workflow_id is None


def test_a_waiting_message_is_never_leased_expired_or_probed_and_shows_in_counts(storage):
    [parent] = insert(storage, "t.wait.parent", 1)
    [waiting] = _submit(storage, _steps("t.wait", (), depends_on={0: [parent]}))
    now = clock.now()
    far = clock.after(now, 7200)
    assert storage.leases.lock_batch(LockRequest(Shard("t.wait"), "c1", 30, far, limit=10)) == []
    assert storage.leases.lock_serial(LockRequest(Shard("t.wait"), "c1", 30, far)) == []
    assert storage.leases.expire_leases(far, 100, "b1", lambda topic: 10) == 0
    assert storage.probes.next_due(Shard("t.wait")) is None
    assert storage.probes.earliest_new(["t.wait"]) == {}
    assert _count(storage, "t.wait") == {S.WAITING.value: 1}
    assert _status(storage, waiting) == S.WAITING.value


def test_a_waiting_message_can_be_cancelled(storage):
    [parent] = insert(storage, "t.cancel", 1)
    [waiting] = _submit(storage, _steps("t.cancel", (), depends_on={0: [parent]}))
    assert storage.messages.cancel([waiting, parent]) == [True, True]
    assert storage.reads.get_message(waiting) is None
    assert _count(storage, "t.cancel") == {}


def test_cancelling_a_message_waited_on_cancels_what_waits_on_it(storage):
    [parent] = insert(storage, "t.cancel.parent", 1)
    child, grandchild = _submit(storage, _steps("t.cancel.child", (), (0,), depends_on={0: [parent]}))
    assert storage.messages.cancel([parent]) == [True]
    assert (_status(storage, child), _status(storage, grandchild)) == (S.CANCELLED.value, S.CANCELLED.value)
    [stop] = [e for e in _events(storage, child) if e["event"] == "DEPENDENCY_FAILED"]
    assert (stop["dependency"], stop["dependency_status"]) == (str(parent), S.CANCELLED.value)


def test_an_operators_delete_of_a_message_waited_on_cancels_what_waits_on_it(storage):
    [parent] = insert(storage, "t.delete.parent", 1)
    [child] = _submit(storage, _steps("t.delete.child", (), depends_on={0: [parent]}))
    [cont] = _submit(storage, _steps("t.delete.cont", (), depends_on={0: [parent]}, modes={0: WaitMode.AFTER_COMPLETE}))
    released: dict[str, dict[int, int]] = {}
    assert storage.messages.delete_messages([parent], released) == 1
    assert (_status(storage, child), _status(storage, cont)) == (S.CANCELLED.value, S.NEW.value)
    [stop] = [e for e in _events(storage, child) if e["event"] == "DEPENDENCY_FAILED"]
    assert stop["dependency"] == str(parent)
    # The step that waited for it to end whatever the outcome is due now: its pulls are woken.
    assert released == {"t.delete.cont": {cont: storage.reads.get_message(cont).priority}}


def test_a_failed_dependency_cancels_what_waits_on_it_transitively(storage):
    root, child, grandchild, free = _submit(storage, _steps("t.stop", (), (0,), (1,), ()))
    [leased_root, leased_free] = sorted(lock(storage, "t.stop"), key=lambda m: m.id)
    assert ack(storage, [AckItem(leased_root.id, leased_root.lease_token, False, "boom")]) == [AckOutcome.APPLIED]
    assert [_status(storage, i) for i in (root, child, grandchild, free)] == \
        [S.FAIL.value, S.CANCELLED.value, S.CANCELLED.value, S.RUNNING.value]
    [stop] = [e for e in _events(storage, grandchild) if e["event"] == "DEPENDENCY_FAILED"]
    assert (stop["dependency"], stop["dependency_status"]) == (str(child), S.CANCELLED.value)
    [stop] = [e for e in _events(storage, child) if e["event"] == "DEPENDENCY_FAILED"]
    assert (stop["dependency"], stop["dependency_status"]) == (str(root), S.FAIL.value)
    # A step submitted after the failure is stored cancelled, and so are the steps after it.
    late, after_late = _submit(storage, _steps("t.stop", (), (0,), depends_on={0: [root]}))
    assert [_status(storage, i) for i in (late, after_late)] == [S.CANCELLED.value, S.CANCELLED.value]
    assert lock(storage, "t.stop") == []


def test_a_retry_of_a_dependency_keeps_its_steps_waiting(storage):
    [parent] = storage.messages.insert_messages(rows("t.retry", 1, retry=1), clock.now())
    [waits] = _submit(storage, _steps("t.retry", (), depends_on={0: [parent]}))
    [leased] = lock(storage, "t.retry")
    assert ack(storage, [AckItem(leased.id, leased.lease_token, False, "once")]) == [AckOutcome.APPLIED]
    assert (_status(storage, parent), _status(storage, waits)) == (S.NEW.value, S.WAITING.value)
    assert storage.reads.get_message(waits).deps_left == 1


def test_a_poison_dependency_cancels_what_waits_on_it(storage):
    root, child = _submit(storage, _steps("t.poison", (), (0,)))
    [leased] = lock(storage, "t.poison", ttr=1)
    assert leased.id == root
    later = clock.after(clock.now(), 5)
    assert storage.leases.expire_leases(later, 100, "b1", lambda topic: 1) == 1
    assert (_status(storage, root), _status(storage, child)) == (S.FAIL.value, S.CANCELLED.value)
    [stop] = [e for e in _events(storage, child) if e["event"] == "DEPENDENCY_FAILED"]
    assert (stop["dependency"], stop["dependency_status"]) == (str(root), S.FAIL.value)


def test_a_submission_retried_with_its_request_id_gets_its_first_answer(storage):
    [parent] = insert(storage, "t.request", 1)
    steps = _steps("t.request", (), (0,), depends_on={0: [parent]})
    first = storage.dependencies.insert_steps(steps, clock.now(), "call-deps-1")
    assert storage.dependencies.insert_steps(steps, clock.now(), "call-deps-1") == first
    assert _count(storage, "t.request") == {S.NEW.value: 1, S.WAITING.value: 2}
    with pytest.raises(MalformedRequestError, match="already used for a Produce call of 2 messages, not 1"):
        storage.dependencies.insert_steps(steps[:1], clock.now(), "call-deps-1")


def test_a_released_step_keeps_a_later_effect_time_of_its_own(storage):
    [parent] = insert(storage, "t.later.parent", 1)
    now_due, [later] = _submit(storage, _steps("t.later", (), depends_on={0: [parent]})), \
        _submit(storage, _steps("t.later", (), depends_on={0: [parent]}, delay=3600))
    [got] = lock(storage, "t.later.parent")
    ack(storage, [AckItem(got.id, got.lease_token, True)])
    early, late = storage.reads.get_message(now_due[0]), storage.reads.get_message(later)
    assert (early.status, late.status) == (S.NEW.value, S.NEW.value)
    assert late.effect_time > clock.after(clock.now(), 3000) and early.effect_time <= clock.now()


def _fail(storage, topic, expected):
    """Lease what is due of ``topic``, check it is exactly ``expected``, and ack it failed."""
    batch = lock(storage, topic)
    assert sorted(m.id for m in batch) == sorted(expected)
    assert ack(storage, [AckItem(m.id, m.lease_token, False, "boom") for m in batch]) == \
        [AckOutcome.APPLIED] * len(batch)


def test_cancelling_a_dependency_names_the_steps_it_released(storage):
    # The broker wakes the pulls of what a cancel released, as it does for an ack's.
    [parent] = insert(storage, "t.cancel.free", 1)
    after_complete, after_success = _submit(storage, _steps("t.cancel.free", (), (),
                                                            depends_on={0: [parent], 1: [parent]},
                                                            modes={0: WaitMode.AFTER_COMPLETE}))
    released = {}
    assert storage.messages.cancel([parent], released) == [True]
    assert released == {"t.cancel.free": {after_complete: 0}}
    assert (_status(storage, after_complete), _status(storage, after_success)) == (S.NEW.value, S.CANCELLED.value)
    assert storage.messages.cancel([after_success], released) == [False]  # ended already: nothing more
    assert released == {"t.cancel.free": {after_complete: 0}}


def test_policy_continue_runs_a_step_after_a_failed_dependency_and_counts_it(storage):
    # a fails, b succeeds; c waits after complete on both, d after success on a (policy stop),
    # e after complete on d, which is cancelled by a's failure.
    a, b, c, d, e = _submit(storage, _steps("t.cont", (), (), (0, 1), (0,), (3,),
                                            modes={2: WaitMode.AFTER_COMPLETE, 4: WaitMode.AFTER_COMPLETE}))
    batch = {m.id: m for m in lock(storage, "t.cont")}
    assert sorted(batch) == [a, b]
    released = {}
    assert storage.acks.ack([AckItem(a, batch[a].lease_token, False, "boom")], clock.now(), "c1", "b1",
                            TopicSettings, released) == [AckOutcome.APPLIED]
    assert released == {"t.cont": {e: 0}}  # its only dependency, d, was cancelled by a's failure
    stored = {i: storage.reads.get_message(i) for i in (c, d, e)}
    assert (stored[c].status, stored[c].deps_left, stored[c].deps_failed) == (S.WAITING.value, 1, 1)
    assert stored[d].status == S.CANCELLED.value
    assert (stored[e].status, stored[e].deps_left, stored[e].deps_failed) == (S.NEW.value, 0, 1)
    _succeed(storage, "t.cont", [e])
    assert _status(storage, c) == S.WAITING.value
    assert ack(storage, [AckItem(b, batch[b].lease_token, True)]) == [AckOutcome.APPLIED]
    assert _status(storage, c) == S.NEW.value  # released by b, the last to end
    [met] = [x for x in _events(storage, c) if x["event"] == "DEPENDENCY_MET"]
    assert met["dependency"] == str(b)
    _succeed(storage, "t.cont", [c])


def test_a_step_waiting_after_failure_runs_only_if_a_dependency_did_not_succeed(storage):
    # Two batches of two members, each with an on_failure (mode 2) and an on_success (mode 0)
    # callback, and a step after the on_failure callback of the first.
    steps = _steps("t.onfail", (), (), (0, 1), (0, 1), (2,), (), (), (5, 6), (5, 6),
                   modes={2: WaitMode.AFTER_FAILURE, 7: WaitMode.AFTER_FAILURE})
    ids = _submit(storage, steps)
    ok_members, ok_failure, ok_success, after_failure = ids[0:2], ids[2], ids[3], ids[4]
    bad_members, bad_failure, bad_success = ids[5:7], ids[7], ids[8]
    batch = {m.id: m for m in lock(storage, "t.onfail")}
    assert sorted(batch) == sorted(ok_members + bad_members)
    ack(storage, [AckItem(i, batch[i].lease_token, True) for i in ok_members + bad_members[:1]])
    ack(storage, [AckItem(bad_members[1], batch[bad_members[1]].lease_token, False, "boom")])
    assert _status(storage, ok_success) == S.NEW.value
    assert (_status(storage, ok_failure), _status(storage, after_failure)) == (S.CANCELLED.value, S.CANCELLED.value)
    [skip] = [x for x in _events(storage, ok_failure) if x["event"] == "DEPENDENCIES_SUCCEEDED"]
    assert skip["dependency"] in {str(i) for i in ok_members}
    stored = storage.reads.get_message(bad_failure)
    assert (stored.status, stored.deps_failed) == (S.NEW.value, 1)
    assert _status(storage, bad_success) == S.CANCELLED.value


def test_a_step_after_complete_on_a_dependency_already_failed_is_due_at_submit(storage):
    [parent] = insert(storage, "t.late.cont", 1)
    [leased] = lock(storage, "t.late.cont")
    ack(storage, [AckItem(leased.id, leased.lease_token, False, "boom")])
    done, on_failure, stopped = _submit(storage, _steps("t.late.cont2", (), (), (),
                                                        depends_on={0: [parent], 1: [parent], 2: [parent]},
                                                        modes={0: WaitMode.AFTER_COMPLETE, 1: WaitMode.AFTER_FAILURE}))
    assert [(_status(storage, i), storage.reads.get_message(i).deps_failed) for i in (done, on_failure)] == \
        [(S.NEW.value, 1), (S.NEW.value, 1)]
    assert _status(storage, stopped) == S.CANCELLED.value
    [succeeded] = insert(storage, "t.late.ok", 1)
    [leased] = lock(storage, "t.late.ok")
    ack(storage, [AckItem(leased.id, leased.lease_token, True)])
    [unneeded] = _submit(storage, _steps("t.late.ok", (), depends_on={0: [succeeded]},
                                         modes={0: WaitMode.AFTER_FAILURE}))
    assert _status(storage, unneeded) == S.CANCELLED.value


def test_a_bad_wait_mode_is_refused_naming_the_modes(storage):
    with pytest.raises(DependencyError, match=r"wait_mode 7; the modes are 0 \(after_success\)"):
        _submit(storage, _steps("t.mode", (), (0,), modes={1: 7}))
    assert _count(storage, "t.mode") == {}


def test_an_ack_of_more_members_than_one_statement_counts_takes_the_fan_in_to_one_then_zero(storage):
    # Over a thousand acked ids: the children's counts come in chunks, summed before any child
    # is judged, so the body is lowered once by all of them and released by the last ack only.
    n = MAX_DEPENDENCIES + 200
    ids = _submit(storage, _steps("t.wide.ack", *([()] * n), tuple(range(n))))
    body = ids[-1]
    leased = []
    while len(leased) < n:
        leased += lock(storage, "t.wide.ack", limit=500)
    released: dict[str, dict[int, int]] = {}
    storage.acks.ack([AckItem(m.id, m.lease_token, True) for m in leased[:-1]], clock.now(), "c1", "b1",
                     TopicSettings, released)
    assert (released, _status(storage, body), storage.reads.get_message(body).deps_left) == ({}, S.WAITING.value, 1)
    storage.acks.ack([AckItem(leased[-1].id, leased[-1].lease_token, True)], clock.now(), "c1", "b1", TopicSettings,
                     released)
    stored = storage.reads.get_message(body)
    assert released == {"t.wide.ack": {body: 0}} and (stored.status, stored.deps_left) == (S.NEW.value, 0)
    assert storage.dependencies.workflow(ids[0]).steps_left == 1  # the body, still to run
