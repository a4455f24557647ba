"""A viewer can look at every page but change nothing."""

from __future__ import annotations

import pytest

from tidemq_broker.storage import MessageFilter

from tests.admin.conftest import fail_all, produce
from tests.observe import list_messages

VIEWER_PAGES = ["/", "/messages", "/messages?status=FAIL", "/workflows", "/topics", "/cluster"]


@pytest.mark.parametrize("path", VIEWER_PAGES)
def test_viewer_sees_pages(viewer, storage, path):
    produce(storage, "orders", ['{"a": 1}'])
    resp = viewer.get(path)
    assert resp.status_code == 200


def test_viewer_sees_message_detail_without_action_buttons(viewer, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    fail_all(storage, "orders")
    html = viewer.get(f"/messages/{msg_id}").get_data(as_text=True)
    assert "Trace" in html and "FAIL" in html
    assert 'id="retry"' not in html and "Delete</button>" not in html
    listing = viewer.get("/messages?status=FAIL").get_data(as_text=True)
    assert "Requeue all FAIL" not in listing and 'name="ids"' not in listing


def test_every_change_is_refused_for_a_viewer(viewer, storage):
    ids = produce(storage, "orders", ['{"a": 1}', '{"a": 2}', '{"a": 3}'])
    failed = fail_all(storage, "orders", limit=1)
    pending = [i for i in ids if i not in failed]
    before = {i: storage.reads.get_message(i) for i in ids}
    attempts = [
        (f"/messages/{pending[0]}/edit", {"data": '{"x": 1}', "status": "FAIL", "retry_remaining": "5",
                                          "effect_time": "2030-01-01T00:00", "version": "0"}),
        (f"/messages/{failed[0]}/retry", {"retries": "2"}),
        (f"/messages/{pending[0]}/cancel", {}),
        (f"/messages/{pending[1]}/delete", {}),
        ("/messages/bulk", {"ids": [str(i) for i in ids], "action": "delete"}),
        ("/messages/bulk", {"ids": [str(i) for i in ids], "action": "requeue"}),
        ("/messages/requeue", {"topic": "orders"}),
        ("/messages/new", {"topic": "orders", "data": "{}", "delay": "0", "retry": "0"}),
        ("/topics/orders/edit", {"retry_count": "9", "retry_base": "1", "retry_max": "2", "ttr": "5",
                                 "retention_days": "1", "max_deliveries": "2"}),
        ("/topics/orders/pause", {}),
    ]
    for path, data in attempts:
        resp = viewer.post(path, data)
        assert resp.status_code == 403, path
        assert "viewer" in resp.get_data(as_text=True)
    after = {i: storage.reads.get_message(i) for i in ids}
    assert after == before
    assert len(list_messages(storage, MessageFilter(), 100)) == 3
    [orders] = [t for t in storage.topics.list_topics() if t.name == "orders"]
    assert orders.retry_count == 3 and not orders.paused and orders.max_deliveries == 10


def test_viewer_may_sign_out(viewer):
    assert viewer.post("/logout").status_code == 302
    assert viewer.get("/").status_code == 302
