"""The console's reads of workflows, on every storage (memory, SQLite, MariaDB, Galera): a page of
workflows newest first with their counts and derived state, paged and filtered by state, and one
workflow's graph (its steps and the edges among them), cut at a limit that says what it left out."""

from __future__ import annotations

import pytest

from tests.conformance.storage_ops import ack, insert, lock, rows
from tidemq import clock
from tidemq.lifecycle import MessageStatus as S
from tidemq_broker.storage import AckItem, WorkflowStep
from tidemq_broker.workflow_view import workflow_state


@pytest.fixture
def storage(any_storage):
    return any_storage


def _submit(storage, topic, *after, depends_on=None):
    made = rows(topic, len(after))
    steps = [WorkflowStep(row, tuple((depends_on or {}).get(i, ())), tuple(waits))
             for i, (row, waits) in enumerate(zip(made, after))]
    return storage.dependencies.insert_steps(steps, clock.now(), broker="b1")


def _finish(storage, topic, ok=True):
    """Lease what is due of ``topic`` and ack it all ``ok`` (a FAIL when not: no retries)."""
    batch = lock(storage, topic)
    assert batch
    ack(storage, [AckItem(m.id, m.lease_token, ok) for m in batch])


#: Wider than any id a session makes: the tables are emptied between tests, not their id counters
#: (on Galera ids step by the cluster's size), so ids keep growing through a test session.
EVERY_ID = 10 ** 15


def _page(storage, state=None, limit=10, before_id=None, window=EVERY_ID):
    return storage.console.workflow_page(state, limit, before_id, window)


def test_the_state_is_derived_from_the_steps_statuses():
    assert workflow_state({"SUCCESS": 3, "WAITING": 1}) == "running"
    assert workflow_state({"SUCCESS": 3, "NEW": 1, "FAIL": 1}) == "running"
    assert workflow_state({"SUCCESS": 2, "FAIL": 1, "CANCELLED": 2}) == "failed"
    assert workflow_state({"SUCCESS": 2, "CANCELLED": 2}) == "cancelled"
    assert workflow_state({"SUCCESS": 2, "RUNNING": 0}) == "succeeded"


def test_a_page_lists_workflows_newest_first_with_their_counts_and_state(storage):
    insert(storage, "t.plain", 3)  # messages of no workflow are not listed
    chain = _submit(storage, "t.wf.chain", (), (0,), (1,))
    group = _submit(storage, "t.wf.group", (), ())
    failing = _submit(storage, "t.wf.fail", (), (0,), (1,))
    _finish(storage, "t.wf.group")
    _finish(storage, "t.wf.fail", ok=False)  # its dependents are cancelled (policy stop)
    page = _page(storage)
    assert [w.id for w in page.workflows] == [failing[0], group[0], chain[0]]
    assert page.next_before_id is None
    by_id = {w.id: w for w in page.workflows}
    assert by_id[chain[0]].counts == {S.NEW.value: 1, S.WAITING.value: 2}
    assert (by_id[chain[0]].steps, by_id[chain[0]].state) == (3, "running")
    assert (by_id[group[0]].counts, by_id[group[0]].state) == ({S.SUCCESS.value: 2}, "succeeded")
    assert by_id[failing[0]].counts == {S.FAIL.value: 1, S.CANCELLED.value: 2}
    assert by_id[failing[0]].state == "failed"
    for summary in page.workflows:
        assert summary.first_created <= summary.last_updated


def test_a_page_is_filtered_by_state(storage):
    running = _submit(storage, "t.wf.run", (), (0,))
    done = _submit(storage, "t.wf.done", ())
    _finish(storage, "t.wf.done")
    cancelled = _submit(storage, "t.wf.cancel", (), (0,))
    # Cancelling the first step (NEW) deletes it and cancels the step after it: the workflow is
    # still listed, under the id of the step that is gone.
    assert storage.messages.cancel([cancelled[0]]) == [True]
    assert [w.id for w in _page(storage, "running").workflows] == [running[0]]
    assert [w.id for w in _page(storage, "succeeded").workflows] == [done[0]]
    cancelled_page = _page(storage, "cancelled").workflows
    assert [(w.id, w.counts) for w in cancelled_page] == [(cancelled[0], {S.CANCELLED.value: 1})]
    assert _page(storage, "failed").workflows == []


def test_pages_follow_each_other_by_id_and_a_window_bounds_a_page(storage):
    ids = [_submit(storage, "t.wf.pages", (), (0,))[0] for _ in range(5)]
    first = _page(storage, limit=2)
    assert [w.id for w in first.workflows] == ids[:2:-1][:2] == [ids[4], ids[3]]
    second = _page(storage, limit=2, before_id=first.next_before_id)
    assert [w.id for w in second.workflows] == [ids[2], ids[1]]
    third = _page(storage, limit=2, before_id=second.next_before_id)
    assert [w.id for w in third.workflows] == [ids[0]]
    assert third.next_before_id is None
    # A window smaller than the ids: the page holds what the window saw and goes on below it.
    narrow = _page(storage, limit=10, before_id=ids[4], window=ids[4] - ids[3])
    assert [w.id for w in narrow.workflows] == [ids[3]]
    assert narrow.next_before_id == narrow.scanned_from == ids[3]


def test_a_graph_holds_the_steps_and_the_edges_among_them(storage):
    [earlier] = insert(storage, "t.wf.before", 1)
    a, b, c, d = _submit(storage, "t.wf.graph", (), (0,), (0,), (1, 2), depends_on={0: [earlier]})
    _finish(storage, "t.wf.before")
    graph = storage.console.workflow_graph(a, 500)
    # The message stored before that the first step waits on joined the workflow: it is drawn
    # with its edge, but it is not one of the workflow's steps.
    assert [(n.id, n.topic, n.status) for n in graph.nodes] == [
        (earlier, "t.wf.before", S.SUCCESS.value), (a, "t.wf.graph", S.NEW.value),
        (b, "t.wf.graph", S.WAITING.value), (c, "t.wf.graph", S.WAITING.value), (d, "t.wf.graph", S.WAITING.value)]
    assert graph.edges == [(earlier, a), (a, b), (a, c), (b, d), (c, d)]
    assert graph.hidden == 0
    assert (graph.summary.id, graph.summary.steps, graph.summary.state) == (a, 4, "running")
    _finish(storage, "t.wf.graph")
    assert {n.id: n.status for n in storage.console.workflow_graph(a, 500).nodes}[a] == S.SUCCESS.value


def test_a_graph_tells_the_running_steps_marked_cancelled(storage):
    first, second = _submit(storage, "t.wf.marked", (), ())
    assert len(lock(storage, "t.wf.marked")) == 2
    assert storage.messages.cancel([first], None, clock.now(), user="ada") == [True]
    nodes = storage.console.workflow_graph(first, 500).nodes
    assert [(n.id, n.status, n.cancel_requested) for n in nodes] == [
        (first, S.RUNNING.value, True), (second, S.RUNNING.value, False)]


def test_a_graph_over_the_limit_says_how_many_steps_it_left_out(storage):
    ids = _submit(storage, "t.wf.big", (), *[(i,) for i in range(11)])
    graph = storage.console.workflow_graph(ids[0], 5)
    assert [n.id for n in graph.nodes] == ids[:5]
    assert graph.edges == [(ids[i], ids[i + 1]) for i in range(4)]
    assert (graph.hidden, graph.summary.steps) == (7, 12)


def test_a_workflow_that_is_not_stored_has_no_graph(storage):
    [plain] = insert(storage, "t.wf.none", 1)
    assert storage.console.workflow_graph(plain, 500) is None
    assert storage.console.workflow_graph(plain + 10_000, 500) is None
    assert _page(storage).workflows == []
