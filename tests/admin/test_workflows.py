"""The console's workflow pages: the list (state, paging, filter) and one workflow drawn as SVG
with its steps, on the real MariaDB."""

from __future__ import annotations

import re

import pytest

from tests.admin.conftest import ADMIN, cancel_signals, fail_all, lease_all, produce
from tidemq import clock
from tidemq_admin.dag import layers
from tidemq_admin.views import workflows as workflow_views
from tidemq_broker.storage import AckItem, LockRequest, NewRow, Shard, TopicSettings, WorkflowStep
from tidemq_broker.workflow_view import WorkflowNode


def submit(storage, topic, *after, depends_on=None):
    """Store one workflow: a step per entry of ``after`` (the positions it waits on)."""
    now = clock.now()
    storage.topics.ensure_topics([topic], now)
    return storage.dependencies.insert_steps(
        [WorkflowStep(NewRow(topic=topic, data=f'{{"step": {i}}}', effect_time=now, retry_remaining=0),
                      tuple((depends_on or {}).get(i, ())), tuple(waits)) for i, waits in enumerate(after)],
        now, broker="test")


def succeed_all(storage, topic):
    locked = storage.leases.lock_batch(LockRequest(Shard(topic), "test-consumer", 30, clock.now(), limit=1000))
    storage.acks.ack([AckItem(m.id, m.lease_token, True) for m in locked], clock.now(), "test-consumer", "b",
                     TopicSettings)
    return [m.id for m in locked]


def _rows(html):
    return [int(id) for id in re.findall(r'<tr data-workflow="(\d+)"', html)]


def test_the_navigation_links_the_list_and_the_list_shows_each_workflow_with_its_state(viewer, storage):
    produce(storage, "plain", ['{"a": 1}'])
    running = submit(storage, "wf.a", (), (0,))
    done = submit(storage, "wf.b", ())
    succeed_all(storage, "wf.b")
    html = viewer.get("/").get_data(as_text=True)
    assert 'href="/workflows"' in html
    page = viewer.get("/workflows").get_data(as_text=True)
    assert _rows(page) == [done[0], running[0]]
    assert f'href="/workflows/{running[0]}"' in page
    assert re.search(rf'data-workflow="{done[0]}".*?w-succeeded">succeeded<', page, re.S)
    assert re.search(rf'data-workflow="{running[0]}".*?w-running">running<', page, re.S)


def test_the_list_is_filtered_by_state_and_refuses_an_unknown_state(viewer, storage):
    running = submit(storage, "wf.run", (), (0,))
    failed = submit(storage, "wf.fail", (), (0,))
    fail_all(storage, "wf.fail")
    assert _rows(viewer.get("/workflows?state=failed").get_data(as_text=True)) == [failed[0]]
    assert _rows(viewer.get("/workflows?state=running").get_data(as_text=True)) == [running[0]]
    empty = viewer.get("/workflows?state=succeeded").get_data(as_text=True)
    assert _rows(empty) == [] and 'id="no-workflows"' in empty
    bad = viewer.get("/workflows?state=done")
    assert bad.status_code == 400
    text = bad.get_data(as_text=True)
    assert "Unknown workflow state" in text and "running, succeeded, failed, cancelled" in text


def test_the_list_pages_older_workflows(viewer, storage, monkeypatch):
    monkeypatch.setattr(workflow_views, "PAGE_SIZE", 2)
    ids = [submit(storage, "wf.page", (), (0,))[0] for _ in range(5)]
    first = viewer.get("/workflows").get_data(as_text=True)
    assert _rows(first) == [ids[4], ids[3]]
    older = re.search(r'href="(/workflows\?before=\d+)" class="next"', first).group(1)
    second = viewer.get(older).get_data(as_text=True)
    assert _rows(second) == [ids[2], ids[1]]
    older = re.search(r'href="(/workflows\?before=\d+)" class="next"', second).group(1)
    third = viewer.get(older).get_data(as_text=True)
    assert _rows(third) == [ids[0]] and 'class="next"' not in third
    filtered = viewer.get("/workflows?state=running").get_data(as_text=True)
    assert re.search(r'href="/workflows\?before=\d+&amp;state=running" class="next"', filtered)


def test_a_workflow_page_draws_its_steps_and_edges_and_links_each_step(viewer, storage):
    a, b, c, d = submit(storage, "wf.dag", (), (0,), (0,), (1, 2))
    succeed_all(storage, "wf.dag")  # a succeeds; b and c are released
    html = viewer.get(f"/workflows/{a}").get_data(as_text=True)
    assert '<svg class="dag"' in html
    for id in (a, b, c, d):
        assert f'id="node-{id}"' in html and f'href="/messages/{id}"' in html
    assert re.search(rf'class="node n-success" id="node-{a}"', html)
    assert re.search(rf'class="node n-new" id="node-{b}"', html)
    assert re.search(rf'class="node n-waiting" id="node-{d}"', html)
    for edge in (f"{a}-{b}", f"{a}-{c}", f"{b}-{d}", f"{c}-{d}"):
        assert f'data-edge="{edge}"' in html
    assert 'id="state">running<' in html and 'id="steps-table"' in html and 'more steps not drawn' not in html
    # The message page links to its workflow.
    assert f'href="/workflows/{a}" id="workflow"' in viewer.get(f"/messages/{d}").get_data(as_text=True)
    [plain] = produce(storage, "plain", ['{"a": 1}'])
    assert 'id="workflow"' not in viewer.get(f"/messages/{plain}").get_data(as_text=True)


def test_a_workflow_over_the_drawing_limit_says_how_many_steps_are_not_drawn(viewer, storage, monkeypatch):
    monkeypatch.setattr(workflow_views, "GRAPH_NODES", 3)
    ids = submit(storage, "wf.big", (), *[(0,)] * 7)
    html = viewer.get(f"/workflows/{ids[0]}").get_data(as_text=True)
    assert "5 more steps not drawn" in html
    assert html.count('class="node ') == 3 and f'id="node-{ids[3]}"' not in html


def test_a_missing_workflow_is_a_404_that_says_so(viewer, storage):
    [plain] = produce(storage, "plain", ['{"a": 1}'])
    for id in (plain, 999_999_999):
        resp = viewer.get(f"/workflows/{id}")
        assert resp.status_code == 404
        assert f"Workflow {id} does not exist" in resp.get_data(as_text=True)


@pytest.mark.parametrize("edges, expected", [
    ([], {1: (0, 0), 2: (0, 1)}),
    ([(1, 2), (2, 3)], {1: (0, 0), 2: (1, 0), 3: (2, 0)}),
    # The longest path decides: 4 waits on 1 directly and through 2 and 3, so it sits after 3.
    ([(1, 2), (2, 3), (3, 4), (1, 4)], {1: (0, 0), 2: (1, 0), 3: (2, 0), 4: (3, 0)}),
    ([(1, 2), (1, 3), (2, 4), (3, 4)], {1: (0, 0), 2: (1, 0), 3: (1, 1), 4: (2, 0)}),
])
def test_the_layout_puts_a_step_in_the_column_of_its_longest_path_from_a_root(edges, expected):
    ids = sorted(expected)
    assert layers([WorkflowNode(i, "t", "NEW") for i in ids], edges) == expected


def test_an_admin_cancels_a_running_workflow_whole_and_its_running_steps_workers_are_signalled(
        admin, viewer, storage, settings):
    first, second, third = submit(storage, "wf.cx", (), (0,), (1,))
    assert [m.id for m in lease_all(storage, "wf.cx")] == [first]
    assert 'id="cancel-workflow"' not in viewer.get(f"/workflows/{first}").get_data(as_text=True)
    assert viewer.post(f"/workflows/{first}/cancel").status_code == 403
    assert 'id="cancel-workflow"' in admin.get(f"/workflows/{first}").get_data(as_text=True)
    with cancel_signals(settings, "wf.cx", "orders") as (heard, elsewhere):
        page = admin.post(f"/workflows/{first}/cancel", follow_redirects=True).get_data(as_text=True)
        assert f"Workflow {first} is cancelled: 2 steps removed, 1 running step marked to stop." in page
        assert "running steps learn of it now" in page
        assert heard.wait(10), "the running step's workers were not signalled"
        assert not elsewhere.is_set()
    assert [storage.reads.get_message(i) for i in (second, third)] == [None, None]
    running = storage.reads.get_message(first)
    assert (running.status, running.cancel_requested) == ("RUNNING", True)
    assert "CANCEL_REQUESTED" in running.trace and f"user={ADMIN}" in running.trace
    # Until the marked step stops, its page says so and offers no second cancel.
    page = admin.get(f"/workflows/{first}").get_data(as_text=True)
    assert '<span class="badge w-cancelling" id="state">cancelling</span>' in page
    assert "waiting for 1 running step to stop" in page and 'id="cancel-workflow"' not in page
    # A second cancel (an old tab's form) removes nothing, marks nothing new, and tells the workers again.
    page = admin.post(f"/workflows/{first}/cancel", follow_redirects=True).get_data(as_text=True)
    assert f"Workflow {first} is cancelled: 0 steps removed, its running steps marked before to stop." in page


def test_a_workflow_whose_running_step_was_not_marked_is_still_running_and_offers_its_cancel(admin, storage):
    """A cancel without ``running`` (a broker's ``cancel_workflow(id)``) lets a running step run its
    course: the workflow runs on, and an admin can still stop that step from its page."""
    first, second = submit(storage, "wf.cunmarked", (), (0,))
    lease_all(storage, "wf.cunmarked")
    assert storage.dependencies.cancel_workflows([first], False, clock.now(), broker="b1") == [(1, 0)]
    page = admin.get(f"/workflows/{first}").get_data(as_text=True)
    assert '<span class="badge w-running" id="state">running</span>' in page
    assert 'id="cancel-workflow"' in page and 'id="cancelling"' not in page


def test_a_finished_workflow_offers_no_cancel_and_refuses_one(admin, storage):
    [done] = submit(storage, "wf.cdone", ())
    succeed_all(storage, "wf.cdone")
    assert 'id="cancel-workflow"' not in admin.get(f"/workflows/{done}").get_data(as_text=True)
    page = admin.post(f"/workflows/{done}/cancel", follow_redirects=True).get_data(as_text=True)
    assert f"Workflow {done} was not cancelled: none of its steps is waiting, pending or running." in page
    assert storage.reads.get_message(done).status == "SUCCESS"
