"""The lifecycle of a message with dependencies (``tidemq.dependencies``) and the checks every
storage makes before it writes a submission (``storages/steps.py``)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tidemq import dependencies as deps
from tidemq import trace
from tidemq.errors import (DataTooLargeError, DependencyCycleError, DependencyError, MalformedRequestError,
                           WorkflowTooLargeError)
from tidemq.lifecycle import MessageStatus as S
from tidemq.limits import MAX_BATCH, MAX_DEPENDENCIES, MAX_WORKFLOW_STEPS
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.rpc_build import dependency_ids
from tidemq.canvas import chain, chord, group, sig
from tidemq.workflows import Workflow
from tidemq.tables import MESSAGE as M
from tidemq_broker.storage import NewRow, WorkflowStep
from tidemq_broker.intake import rows_from_request, steps_from_request
from tidemq_broker.storages.memory import open_memory_storage
from tidemq_broker.storages.steps import check_steps, edges, plan
from tidemq_broker.topics import TopicCache

NOW = datetime(2026, 1, 2, 3, 4, 5, 6000)


def _step(*after, depends_on=(), key=None):
    return WorkflowStep(NewRow("t", "{}", NOW, 0, unique_key=key), tuple(depends_on), tuple(after))


def test_a_message_with_dependencies_starts_waiting_and_one_without_new():
    waits = deps.waiting(NOW, 2, broker="b")
    assert (waits.target, waits.values[M.status], waits.values[M.deps_left]) == (S.WAITING, "WAITING", 2)
    assert waits.values[M.workflow_id] is None and trace.parse(waits.trace)[0]["event"] == "PRODUCED"
    assert deps.waiting(NOW, 0).target is S.NEW


def test_a_release_keeps_a_later_effect_time_and_names_the_dependency():
    later = NOW + timedelta(hours=1)
    change = deps.released(NOW, later, 42, "b:1")
    assert (change.source, change.target, change.values[M.effect_time]) == ((S.WAITING,), S.NEW, later)
    assert deps.released(NOW, NOW - timedelta(days=1), 42, "b:1").values[M.effect_time] == NOW
    [entry] = trace.parse(change.trace)
    assert (entry["event"], entry["dependency"], entry["broker"]) == ("DEPENDENCY_MET", "42", "b:1")


def test_a_failed_dependency_cancels_a_waiting_message():
    change = deps.dependency_failed(NOW, 7, "FAIL")
    assert (change.source, change.target, change.values[M.finish_time]) == ((S.WAITING,), S.CANCELLED, NOW)
    [entry] = trace.parse(change.trace)
    assert (entry["event"], entry["dependency"], entry["dependency_status"]) == ("DEPENDENCY_FAILED", "7", "FAIL")


def test_steps_are_ordered_after_what_they_wait_on():
    steps = [_step(2), _step(), _step(1), _step(0, 2)]
    order = check_steps(steps)
    assert order.index(1) < order.index(2) < order.index(0) < order.index(3)


def test_a_cycle_is_named_by_its_steps():
    with pytest.raises(DependencyCycleError, match=r"\(each on the next\): step 1 -> step 3 -> step 2 -> step 1"):
        check_steps([_step(), _step(3), _step(1), _step(2), _step(0)])


def test_too_many_dependencies_a_unique_key_or_a_bad_position_are_refused():
    with pytest.raises(WorkflowTooLargeError, match="MAX_DEPENDENCIES"):
        check_steps([_step(depends_on=range(1, MAX_DEPENDENCIES + 2))])
    with pytest.raises(DependencyError, match="unique_key"):
        check_steps([_step(key="k")])
    with pytest.raises(DependencyError, match="step 0 waits on step -1"):
        check_steps([_step(-1)])


def test_a_step_may_come_after_more_steps_of_its_submission_than_it_may_wait_on_stored_messages():
    # depends_on: each stored message is read and locked, at most MAX_DEPENDENCIES; after: the
    # steps of the same submission, bounded only by MAX_WORKFLOW_STEPS.
    wide = [_step() for _ in range(MAX_DEPENDENCIES + 500)]
    wide.append(_step(*range(len(wide))))
    order = check_steps(wide)
    assert order[-1] == len(wide) - 1
    assert plan(wide, order, {})[-1].deps_left == MAX_DEPENDENCIES + 500
    with pytest.raises(WorkflowTooLargeError, match=r"\(MAX_WORKFLOW_STEPS\), got 10,101"):
        check_steps([_step()] * (MAX_WORKFLOW_STEPS + 1))


def test_a_chord_of_a_whole_batch_is_one_request_and_the_broker_takes_it_up_to_the_step_limit():
    # The shape: MAX_BATCH members and a callback after every one of them, one submission.
    messages = chord(group(sig("w.part", n) for n in range(MAX_BATCH)), sig("w.done")).workflow().messages(1 << 20)
    assert len(messages) == MAX_BATCH + 1 and list(messages[-1].after) == list(range(MAX_BATCH))
    request = pb.ProduceRequest(messages=messages)
    topics = TopicCache(open_memory_storage().topics)
    steps = steps_from_request(request, rows_from_request(request, topics, 1 << 20))
    assert steps is not None and steps[-1].after == tuple(range(MAX_BATCH))
    # More than a workflow may hold: refused naming the limit; a plain batch keeps its own.
    too_many = pb.ProduceRequest(messages=[messages[0]] * MAX_WORKFLOW_STEPS + [messages[-1]])
    with pytest.raises(WorkflowTooLargeError, match="MAX_WORKFLOW_STEPS"):
        rows_from_request(too_many, topics, 1 << 20)
    with pytest.raises(MalformedRequestError, match=f"the limit is {MAX_BATCH} per call"):
        rows_from_request(pb.ProduceRequest(messages=[messages[0]] * (MAX_BATCH + 1)), topics, 1 << 20)


def test_a_plan_counts_what_has_not_succeeded_and_stops_after_a_failure():
    steps = [_step(depends_on=[10, 11]), _step(0, depends_on=[12]), _step(1), _step()]
    statuses = {10: "SUCCESS", 11: "RUNNING", 12: "FAIL"}
    starts = plan(steps, check_steps(steps), statuses)
    assert [(s.deps_left, s.stopped) for s in starts] == [(1, False), (2, True), (1, True), (0, False)]
    assert (starts[1].by_id, starts[1].by_status) == (12, "FAIL")
    assert (starts[2].by_step, starts[2].by_status) == (1, "CANCELLED")
    # Every edge is stored, to finished messages too: a lease names them among a step's
    # dependencies (their results are its inputs), though they never release or stop anything.
    assert edges(steps, [100, 101, 102, 103], statuses) == [(10, 100), (11, 100), (12, 101), (100, 101), (101, 102)]


def test_a_client_names_dependencies_by_id_or_handle_and_refuses_anything_else():
    class Handle:
        id = 7

    assert dependency_ids([3, Handle()]) == [3, 7] and dependency_ids(None) == []
    for bad in ([0], ["7"], [True], [Handle, -1]):
        with pytest.raises(MalformedRequestError, match="depends_on must hold message ids"):
            dependency_ids(bad)
    with pytest.raises(MalformedRequestError, match="MAX_DEPENDENCIES"):
        dependency_ids(range(1, MAX_DEPENDENCIES + 2))


def test_a_workflow_sends_its_steps_with_their_positions_and_refuses_foreign_steps():
    wf = Workflow()
    parts = [wf.add("w.part", {"n": n}) for n in range(2)]
    wf.add("w.join", None, after=parts, depends_on=[9], priority=3)
    messages = wf.messages(1024)
    assert [(m.topic, list(m.after), list(m.depends_on)) for m in messages] == \
        [("w.part", [], []), ("w.part", [], []), ("w.join", [0, 1], [9])]
    assert messages[2].priority == 3 and messages[0].data == '{"n":0}' and len(wf) == 3
    with pytest.raises(DependencyError, match="steps that this workflow's add returned"):
        Workflow().add("w.other", after=[parts[0]])
    wf.add("w.big", "x" * 2000)
    with pytest.raises(DataTooLargeError, match="^step 3: "):
        wf.messages(1024)


def test_chain_group_and_chord_become_steps_after_the_right_ones():
    shape = chain(sig("c.fetch", 1), group(sig("c.part", n) for n in range(3)),
                  chord([sig("c.check", 0), sig("c.check", 1)], sig("c.merge", retry=2)))
    messages = shape.workflow().messages(1024)
    assert [(m.topic, list(m.after)) for m in messages] == [
        ("c.fetch", []), ("c.part", [0]), ("c.part", [0]), ("c.part", [0]),
        ("c.check", [1, 2, 3]), ("c.check", [1, 2, 3]), ("c.merge", [4, 5])]
    assert messages[6].retry == 2

    class Recorder:
        def submit(self, workflow, timeout=None, result=False):
            return list(range(100, 100 + len(workflow)))

    assert chord(group(sig("c.a"), sig("c.b")), sig("c.z")).produce(Recorder()) == [100, 101, 102]
    with pytest.raises(TypeError, match="holds sig"):
        chain(sig("c.a"), "c.b")
