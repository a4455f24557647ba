"""The console's schedules page: next tick, create, edit, pause, delete for admins; viewers read."""

from __future__ import annotations

from tidemq import clock
from tidemq_broker.schedules import check_schedule


def test_admin_creates_edits_pauses_and_deletes_a_schedule(admin, storage):
    page = admin.get("/schedules").get_data(as_text=True)
    assert "No schedules yet" in page and "New schedule" in page
    resp = admin.post("/schedules/new", {"name": "nightly", "topic": "reports.build", "cron": "30 2 * * *",
                                         "timezone": "Asia/Tokyo", "missed": "skip", "retry": "2",
                                         "data": '{"kind": "daily"}'})
    assert resp.status_code == 302
    stored = storage.schedules.get_schedule("nightly")
    assert (stored.topic, stored.cron, stored.timezone, stored.missed, stored.retry, stored.data) == \
        ("reports.build", "30 2 * * *", "Asia/Tokyo", "skip", 2, '{"kind": "daily"}')  # stored as typed
    listing = admin.get("/schedules").get_data(as_text=True)
    # 02:30 in Tokyo is 17:30 UTC the day before.
    assert 'id="schedule-nightly"' in listing and "17:30:00" in listing and "Asia/Tokyo" in listing
    again = admin.post("/schedules/new", {"name": "nightly", "topic": "x", "cron": "* * * * *"})
    assert again.status_code == 400 and "exists; edit it instead" in again.get_data(as_text=True)
    assert admin.post("/schedules/nightly/edit", {"topic": "reports.build", "cron": "0 4 * * *", "timezone": "UTC",
                                                  "missed": "once", "data": "null"}).status_code == 302
    assert storage.schedules.get_schedule("nightly").cron == "0 4 * * *"
    schedules = storage.schedules
    assert admin.post("/schedules/nightly/pause").status_code == 302 and schedules.get_schedule("nightly").paused
    assert "PAUSED" in admin.get("/schedules").get_data(as_text=True)
    assert admin.post("/schedules/nightly/resume").status_code == 302 and not schedules.get_schedule("nightly").paused
    assert admin.post("/schedules/nightly/delete").status_code == 302 and schedules.get_schedule("nightly") is None
    assert admin.post("/schedules/nightly/delete").status_code == 404


def test_bad_fields_are_named_and_nothing_is_stored(admin, storage):
    resp = admin.post("/schedules/new", {"name": "s1", "topic": "t.ok", "cron": "every day", "timezone": "Nowhere/City",
                                         "retry": "-1", "data": "{bad"})
    html = resp.get_data(as_text=True)
    assert resp.status_code == 400
    for field in ("cron", "timezone", "retry", "data"):
        assert f'id="err-{field}"' in html
    assert "5 fields" in html and "IANA" in html
    bad_topic = admin.post("/schedules/new", {"name": "s1", "topic": "bad topic", "cron": "* * * * *"})
    assert bad_topic.status_code == 400 and 'id="err-topic"' in bad_topic.get_data(as_text=True)
    assert storage.schedules.list_schedules() == []


def test_viewer_reads_schedules_but_changes_nothing(viewer, storage):
    storage.schedules.put_schedule(check_schedule("hourly", "t.hourly", "0 * * * *"), clock.now())
    page = viewer.get("/schedules").get_data(as_text=True)
    assert 'id="schedule-hourly"' in page and ":00:00" in page
    assert "New schedule" not in page and "/schedules/hourly/edit" not in page
    for path, data in (("/schedules/new", {"name": "x", "topic": "t", "cron": "* * * * *"}),
                       ("/schedules/hourly/edit", {"topic": "t", "cron": "* * * * *"}),
                       ("/schedules/hourly/pause", {}), ("/schedules/hourly/delete", {})):
        assert viewer.post(path, data).status_code == 403
    hourly = storage.schedules.get_schedule("hourly")
    assert hourly.cron == "0 * * * *" and not hourly.paused


def test_changes_need_the_csrf_token(admin, storage):
    storage.schedules.put_schedule(check_schedule("hourly", "t.hourly", "0 * * * *"), clock.now())
    assert admin.post("/schedules/hourly/delete", csrf=False).status_code == 400
    assert storage.schedules.get_schedule("hourly") is not None


def test_a_huge_field_is_named_with_a_short_message(admin, storage):
    import re

    for field in ("cron", "timezone", "name", "missed"):
        form = {"name": "s2", "topic": "t.ok", "cron": "* * * * *", "timezone": "UTC", "missed": "once"}
        form[field] = "x" * 10_000
        resp = admin.post("/schedules/new", form)
        assert resp.status_code == 400
        shown = re.search(rf'id="err-{field}">([^<]*)<', resp.get_data(as_text=True))
        assert shown, f"{field}: no error shown"
        assert len(shown.group(1)) < 400 and "x" * 61 not in shown.group(1), shown.group(1)
    missing = admin.get("/schedules/" + "y" * 5000 + "/edit")
    assert missing.status_code == 404 and "y" * 61 not in missing.get_data(as_text=True)
    assert storage.schedules.get_schedule("s2") is None
