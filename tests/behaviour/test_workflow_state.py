"""A workflow's state through what an application calls (``workflow_state``, workflow handles,
``cancel_workflow``), against the StubBroker and a real broker alike: counts as steps end,
SUCCEEDED, FAILED under the policy stop, CANCELLED whole (ended once its running step stopped),
a stored message waited on joining the workflow, and an unknown id."""

from __future__ import annotations

import threading

import pytest

from tidemq import chain, group, sig
from tidemq.dependencies import FailurePolicy, WorkflowState
from tidemq.errors import MessageNotFoundError, ResultTimeoutError

from .scenario import ack, pull


def _counts(info):
    return info.state, info.steps_total, info.steps_left, info.steps_failed, info.finished


def test_a_chain_counts_its_steps_down_and_ends_succeeded(double):
    ids = chain(sig("ws.a", 1), group(sig("ws.b", 2), sig("ws.b", 3))).produce(double.link)
    first = double.link.workflow_state(ids)
    assert (first.id, first.policy, first.finished_at) == (ids[0], FailurePolicy.STOP, None)
    assert _counts(first) == (WorkflowState.RUNNING, 3, 3, 0, False)
    ack(double, "ws.a", pull(double, "ws.a"))
    assert _counts(double.link.workflow_state(ids[0])) == (WorkflowState.RUNNING, 3, 2, 0, False)
    ack(double, "ws.b", pull(double, "ws.b"))
    ended = double.link.workflow_handle(ids).wait(timeout=5)
    assert _counts(ended) == (WorkflowState.SUCCEEDED, 3, 0, 0, True)
    assert ended.finished_at >= ended.created_at


def test_a_failure_under_stop_ends_the_workflow_failed_with_what_it_cancelled(double):
    ids = chain(sig("ws.fail", 1, retry=0), sig("ws.never", 2)).produce(double.link)
    ack(double, "ws.fail", pull(double, "ws.fail"), error="boom")
    assert _counts(double.link.workflow_state(ids)) == (WorkflowState.FAILED, 2, 0, 2, True)


def test_a_wait_is_woken_by_the_last_steps_ack(double):
    ids = chain(sig("ws.wake", 1), sig("ws.wake", 2)).produce(double.link)  # one step alone is no workflow
    ack(double, "ws.wake", pull(double, "ws.wake"))
    [delivery] = pull(double, "ws.wake")
    answer = {}
    thread = threading.Thread(target=lambda: answer.setdefault("info", double.link.workflow_state(ids, wait=30)))
    thread.start()
    ack(double, "ws.wake", [delivery])
    thread.join(30)
    assert _counts(answer["info"]) == (WorkflowState.SUCCEEDED, 2, 0, 0, True)


def test_a_workflow_cancelled_whole_ends_once_its_running_step_stopped(double):
    ids = chain(sig("ws.cancel", 1), sig("ws.cancel.next", 2)).produce(double.link)
    running = pull(double, "ws.cancel")
    handle = double.link.workflow_handle(ids)
    assert handle.cancel(running=True) == 2
    assert _counts(handle.state()) == (WorkflowState.CANCELLED, 2, 1, 1, False)
    with pytest.raises(ResultTimeoutError, match=r"\(CANCELLED, 1 of 2 steps left\)"):
        handle.wait(timeout=0)
    ack(double, "ws.cancel", running)
    assert _counts(handle.wait(timeout=5)) == (WorkflowState.CANCELLED, 2, 0, 1, True)
    assert handle.cancel() == 0


def test_a_stored_message_waited_on_joins_the_workflow(double):
    parent = double.link.produce("ws.parent", 1)
    step = double.link.produce("ws.child", 2, depends_on=[parent])
    assert _counts(double.link.workflow_state(step)) == (WorkflowState.RUNNING, 2, 2, 0, False)
    ack(double, "ws.parent", pull(double, "ws.parent"))
    ack(double, "ws.child", pull(double, "ws.child"))
    assert _counts(double.link.workflow_state(step)) == (WorkflowState.SUCCEEDED, 2, 0, 0, True)
    with pytest.raises(MessageNotFoundError, match=f"workflow {parent} is not stored"):
        double.link.workflow_state(parent)
    alone = group(sig("ws.alone", 1), sig("ws.alone", 2)).produce(double.link)  # no step waits: no workflow
    with pytest.raises(MessageNotFoundError, match=f"workflow {alone[0]} is not stored"):
        double.link.workflow_handle(alone).state()
