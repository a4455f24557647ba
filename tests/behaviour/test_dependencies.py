"""Dependencies through what an application calls: ``produce(..., depends_on=...)``, ``submit``
of a Workflow, pulls and acks with results, and a step's ``message.inputs``. Each scenario runs
against the StubBroker and a real broker, so a workflow unit-tested on the stub behaves as it
will on a cluster."""

from __future__ import annotations

import json

import pytest

from tidemq import Workflow, chain, chord, group, sig
from tidemq.errors import DependencyCycleError, InputError, UnknownDependencyError
from tidemq.link import AckItem, AckOutcome
from tidemq.queue_runner import delivery_to_message

from .scenario import CONSUMER, pull


def _succeed(double, topic, value_of):
    """Pull what is due of ``topic`` and ack each SUCCESS with the result ``value_of(delivery)``;
    returns the deliveries."""
    got = pull(double, topic)
    items = [AckItem(d.id, d.lease_token, True, result=json.dumps(value_of(d))) for d in got]
    assert double.link.ack(topic, CONSUMER, items) == [AckOutcome.APPLIED] * len(got)
    return got


def test_a_step_waits_for_its_dependency_and_receives_its_result(double):
    first = double.link.produce("d.first", 20)
    step = double.link.produce("d.next", None, depends_on=[first])
    assert double.stored(step).status == "WAITING"
    assert pull(double, "d.next") == []
    [d] = _succeed(double, "d.first", lambda d: json.loads(d.data) + 1)
    assert d.depends_on == ()
    assert d.workflow_id == step  # a message waited on joins the workflow of what waits on it
    [leased] = pull(double, "d.next")
    assert (leased.id, leased.depends_on) == (step, (first,))
    message = delivery_to_message(leased, double.link)
    assert (message.input, message.inputs) == (21, [21])
    assert double.stored(step).events[:2] == ("PRODUCED", "DEPENDENCY_MET")


def test_a_dependency_that_already_succeeded_is_met_and_still_named(double):
    first = double.link.produce("d.done", 1)
    _succeed(double, "d.done", lambda d: {"rows": 3})
    step = double.link.produce("d.after", None, depends_on=[first])
    [leased] = pull(double, "d.after")
    assert leased.id == step and delivery_to_message(leased, double.link).input == {"rows": 3}


def test_a_chord_callback_gets_the_members_results_in_order(double):
    ids = chord(group(*(sig("d.member", n) for n in range(4))), sig("d.callback", "sum")).produce(double.link)
    members, callback = ids[:4], ids[4]
    assert double.stored(callback).status == "WAITING"
    got = _succeed(double, "d.member", lambda d: json.loads(d.data) * 10)
    assert sorted(d.id for d in got) == sorted(members)
    [leased] = pull(double, "d.callback")
    assert leased.depends_on == tuple(members)
    message = delivery_to_message(leased, double.link)
    assert message.inputs == [0, 10, 20, 30]
    assert {d.workflow_id for d in got} == {members[0]} and message.workflow_id == members[0]
    with pytest.raises(InputError, match="has 4 dependencies"):
        message.input


def test_a_chain_hands_each_result_on(double):
    ids = chain(sig("d.chain", 1), sig("d.chain", None), sig("d.chain", None)).produce(double.link)
    last = None
    for step in ids:
        [leased] = pull(double, "d.chain")
        assert leased.id == step
        message = delivery_to_message(leased, double.link)
        value = message.data if step == ids[0] else message.input + 1
        assert double.link.ack("d.chain", CONSUMER, [AckItem(leased.id, leased.lease_token, True,
                                                             result=json.dumps(value))]) == [AckOutcome.APPLIED]
        last = value
    assert last == 3 and pull(double, "d.chain") == []


def test_a_failed_dependency_cancels_what_waits_on_it_transitively(double):
    wf = Workflow()
    first = wf.add("d.fail", 1, retry=0)
    second = wf.add("d.stopped", 2, after=[first])
    wf.add("d.stopped", 3, after=[second])
    a, b, c = double.link.submit(wf)
    [d] = pull(double, "d.fail")
    assert double.link.ack("d.fail", CONSUMER, [AckItem(d.id, d.lease_token, False, "boom")]) == [AckOutcome.APPLIED]
    assert [double.stored(i).status for i in (a, b, c)] == ["FAIL", "CANCELLED", "CANCELLED"]
    assert "DEPENDENCY_FAILED" in double.stored(c).events
    assert pull(double, "d.stopped") == []


def test_cancelling_a_dependency_cancels_its_waiting_step(double):
    first = double.link.produce("d.cancel", 1, delay=3600)
    step = double.link.produce("d.cancel.next", 2, depends_on=[first])
    assert double.link.cancel(first) is True
    assert double.stored(first) is None and double.stored(step).status == "CANCELLED"


def test_a_cycle_or_an_unknown_dependency_is_refused_and_nothing_is_stored(double):
    wf = Workflow()
    first = wf.add("d.refused", 1)
    wf.add("d.refused", 2, after=[first])
    # Its positions: what a hand-built request could hold, 0 after 1 after 0.
    wf._steps[0] = wf._steps[0][:4] + ([1],) + wf._steps[0][5:]
    with pytest.raises(DependencyCycleError, match="step 0 -> step 1 -> step 0|step 1 -> step 0 -> step 1"):
        double.link.submit(wf)
    with pytest.raises(UnknownDependencyError, match="999999"):
        double.link.produce("d.refused", 3, depends_on=[999999])
    assert pull(double, "d.refused") == []
