"""The topic page shows and edits flow limits; bad numbers are refused with the limit named."""

from __future__ import annotations

from tidemq import clock
from tidemq_broker.storage import FlowLimits

from tests.admin.conftest import produce
from tests.admin.test_topics_dashboard_cluster import SETTINGS, _topic


def test_limits_are_edited_shown_and_cleared(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    form = admin.get("/topics/orders/edit").get_data(as_text=True)
    assert 'name="max_running" value=""' in form and 'name="rate_per_second" value=""' in form
    resp = admin.post("/topics/orders/edit", {**SETTINGS, "max_running": "8", "rate_per_second": "2.5",
                                              "max_running_per_key": "1"})
    assert resp.status_code == 302
    assert _topic(storage, "orders").limits == FlowLimits(8, 2.5, 1)
    html = admin.get("/topics").get_data(as_text=True)
    assert "running &le; 8" in html and "2.5/s" in html and "per key &le; 1" in html
    assert 'name="max_running_per_key" value="1"' in admin.get("/topics/orders/edit").get_data(as_text=True)
    assert admin.post("/topics/orders/edit", SETTINGS).status_code == 302  # empty fields: no limits
    assert _topic(storage, "orders").limits is None


def test_bad_limits_are_named_and_nothing_saved(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    storage.topics.set_topic_limits("orders", FlowLimits(max_running=3), clock.now())
    for field, bad, message in (("max_running", "0", "max running must be a whole number from 1 to 1,000,000"),
                                ("max_running", "٣", "max running must be a whole number"),
                                ("max_running_per_key", "-1", "max running per key must be a whole number"),
                                ("rate_per_second", "0", "rate (messages per second) must be above 0"),
                                ("rate_per_second", "nan", "rate (messages per second) must be between 0"),
                                ("rate_per_second", "fast", "rate (messages per second) must be a number")):
        resp = admin.post("/topics/orders/edit", {**SETTINGS, field: bad})
        assert resp.status_code == 400, (field, bad)
        html = resp.get_data(as_text=True)
        assert f'id="err-{field}"' in html and message in html, (field, bad)
        assert _topic(storage, "orders").limits == FlowLimits(max_running=3)


def test_pausing_keeps_the_limits(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    storage.topics.set_topic_limits("orders", FlowLimits(rate_per_second=4), clock.now())
    admin.post("/topics/orders/pause")
    assert _topic(storage, "orders").limits == FlowLimits(rate_per_second=4.0)
