"""What wakes a broker's waiting pulls besides its commits: a change that makes messages due
without a new id (an ack's or a cancel's release of waiting steps, a requeue) wakes the pulls of
their topics at once, and a requeue signals the other brokers, rather than leaving them to the
earliest-due probe."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.background import InThread
from tests.servers import wait_until
from tests.unit.test_broker_service import Context, memory_service, produce, pull, stored
from tidemq import clock
from tidemq.dependencies import WaitMode
from tidemq.rpc import tidemq_pb2 as pb
from tidemq_broker.storage import NewRow, WorkflowStep


@pytest.fixture
def broker():
    with memory_service() as service:
        yield service


def test_an_ack_that_releases_a_waiting_step_wakes_the_pulls_of_its_topic(broker, monkeypatch):
    [parent] = produce(broker, "s.parent", "1")
    now = clock.now()
    [child] = broker.storage.dependencies.insert_steps([WorkflowStep(NewRow("s.child", "2", now, 0), (parent,))], now)
    waiting = InThread(pull, broker, "s.child", 30.0)
    wait_until(lambda: broker.hub._waiters.get("s.child"), 10, what="the pull to wait")
    woken, notify = [], broker.hub.notify
    monkeypatch.setattr(broker.hub, "notify", lambda topic, *args: (woken.append(topic), notify(topic, *args)))
    [got] = pull(broker, "s.parent", ttr_seconds=30)
    item = pb.AckItem(id=parent, lease_token=got.lease_token, success=True)
    assert list(broker.Ack(pb.AckRequest(items=[item], consumer="c1", topic="s.parent"), Context()).outcomes) == \
        [pb.APPLIED]
    assert woken == ["s.child"]  # the released step's topic, not only the acked one's
    [released] = waiting.value(10)
    assert (released.id, stored(broker, child).status) == (child, "RUNNING")


@pytest.mark.parametrize("whole_workflow", [False, True], ids=["message", "workflow"])
def test_a_cancel_that_releases_a_step_waiting_after_complete_wakes_the_pulls_of_its_topic(broker, monkeypatch,
                                                                                          whole_workflow):
    """A message's cancel, or its whole workflow's, releases another workflow's step that waits on
    it after completion: the broker wakes the pulls waiting for that step."""
    now = clock.now()
    if whole_workflow:
        [parent, _] = broker.storage.dependencies.insert_steps(
            [WorkflowStep(NewRow("s.gone", "1", now, 0)), WorkflowStep(NewRow("s.gone", "2", now, 0), (), (0,))], now)
    else:
        [parent] = produce(broker, "s.gone", "1")
    [child] = broker.storage.dependencies.insert_steps(
        [WorkflowStep(NewRow("s.gone.after", "3", now, 0), (parent,), wait_mode=WaitMode.AFTER_COMPLETE)], now)
    waiting = InThread(pull, broker, "s.gone.after", 30.0)
    wait_until(lambda: broker.hub._waiters.get("s.gone.after"), 10, what="the pull to wait")
    woken, notify = [], broker.hub.notify
    monkeypatch.setattr(broker.hub, "notify", lambda topic, *args: (woken.append(topic), notify(topic, *args)))
    cancel = pb.CancelRequest(ids=[parent], workflow=whole_workflow)
    assert list(broker.Cancel(cancel, Context()).cancelled) == [True] * (2 if whole_workflow else 1)
    assert woken == ["s.gone.after"]  # the probes would find it too, but only up to a second later
    [released] = waiting.value(10)
    assert (released.id, stored(broker, child).status) == (child, "RUNNING")


def test_a_requeue_by_id_wakes_the_pulls_of_its_topics_here_and_signals_the_other_brokers(broker, monkeypatch):
    """A requeued message is due now without a new id, which no insert watch sees."""
    [dead] = produce(broker, "s.again", '"a"', retry=0)
    [failed] = pull(broker, "s.again")
    broker.Ack(pb.AckRequest(items=[pb.AckItem(id=dead, lease_token=failed.lease_token, success=False, error="x")],
                             consumer="c1"), Context())
    waiting = InThread(pull, broker, "s.again", 30.0)
    wait_until(lambda: broker.hub._waiters.get("s.again"), 10, what="the pull to wait")
    woken, notify, signalled = [], broker.hub.notify, []
    monkeypatch.setattr(broker.hub, "notify", lambda topic, *args: (woken.append(topic), notify(topic, *args)))
    monkeypatch.setattr(broker, "signals", SimpleNamespace(released=lambda topics: signalled.extend(topics)))
    assert broker.Requeue(pb.RequeueRequest(ids=[dead, 10 ** 9], retry=0), Context()).requeued == 1
    assert (woken, signalled) == (["s.again"], ["s.again"])  # the probes would find it, up to a second later
    [again] = waiting.value(10)
    assert (again.id, stored(broker, dead).status) == (dead, "RUNNING")
    assert broker.Requeue(pb.RequeueRequest(ids=[dead], retry=0), Context()).requeued == 0  # RUNNING: not moved
    assert (woken, signalled) == (["s.again"], ["s.again"])  # nothing moved, nothing woken
