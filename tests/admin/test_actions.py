"""Admin changes: edit, retry, requeue, cancel, delete, produce; each leaves a trace naming the admin."""

from __future__ import annotations

from datetime import datetime

from tidemq import Settings
from tidemq_broker.storage import MessageFilter

from tests.admin.conftest import (ADMIN, PASSWORD, Browser, cancel_signals, edit_form, fail_all, lease_all, poison_all,
                                  produce)
from tests.observe import list_messages
from tests.servers import free_port


def _edit(admin, msg, **changes):
    return admin.post(f"/messages/{msg.id}/edit", edit_form(msg, **changes))


def test_edit_saves_fields_and_traces_the_admin(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'], delay=3600)
    msg = storage.reads.get_message(msg_id)
    resp = _edit(admin, msg, data='{"a": 2, "note": "fixed"}', retry_remaining="4",
                 effect_time="2031-02-03T04:05:06.789")
    assert resp.status_code == 302
    after = storage.reads.get_message(msg_id)
    assert after.data == '{"a": 2, "note": "fixed"}'
    assert after.retry_remaining == 4
    assert after.effect_time == datetime(2031, 2, 3, 4, 5, 6, 789000)
    assert after.version == msg.version + 1
    last = after.trace.strip().splitlines()[-1]
    assert "ADMIN_EDIT" in last and f"user={ADMIN}" in last and "changed=data,retry_remaining,effect_time" in last


def test_edit_sets_only_what_changed(admin, storage):
    """Fixing the data of a dead letter keeps it FAIL with its finish time: an unchanged status
    is not set again (setting one restarts finish_time)."""
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    fail_all(storage, "orders")
    msg = storage.reads.get_message(msg_id)
    assert _edit(admin, msg, data='{"a": 2}').status_code == 302
    after = storage.reads.get_message(msg_id)
    assert (after.status, after.finish_time, after.data) == ("FAIL", msg.finish_time, '{"a": 2}')
    last = after.trace.strip().splitlines()[-1]
    assert "changed=data" in last and "status=" not in last
    assert _edit(admin, after, status="NEW").status_code == 302
    assert (storage.reads.get_message(msg_id).status, storage.reads.get_message(msg_id).finish_time) == ("NEW", None)


def test_edit_rejects_bad_values_next_to_each_field_and_stores_nothing(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    msg = storage.reads.get_message(msg_id)
    resp = _edit(admin, msg, data="{not json", status="RUNNING", retry_remaining="-1", effect_time="soon")
    assert resp.status_code == 400
    html = resp.get_data(as_text=True)
    assert 'id="err-data"' in html and "valid JSON" in html
    assert 'id="err-status"' in html and 'id="err-retry_remaining"' in html and 'id="err-effect_time"' in html
    assert storage.reads.get_message(msg_id) == msg


def test_edit_of_oversized_data_names_the_limit(admin, app, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    msg = storage.reads.get_message(msg_id)
    limit = app.extensions["tidemq"].settings.max_data_bytes
    resp = _edit(admin, msg, data='"' + "x" * limit + '"')
    assert resp.status_code == 400
    assert f"the limit is {limit} bytes" in resp.get_data(as_text=True)
    assert storage.reads.get_message(msg_id).data == '{"a": 1}'


def test_edit_that_lost_a_race_is_not_saved(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    stale = storage.reads.get_message(msg_id)
    assert _edit(admin, stale, data='{"a": 2}').status_code == 302
    resp = _edit(admin, stale, data='{"a": 3}')
    assert resp.status_code == 409 and "changed while you were editing" in resp.get_data(as_text=True)
    assert storage.reads.get_message(msg_id).data == '{"a": 2}'


def test_a_running_message_cannot_be_edited_or_deleted(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    lease_all(storage, "orders")
    held = storage.reads.get_message(msg_id)  # the edit form carries the row's version
    resp = _edit(admin, held, data='{"a": 9}', status="NEW")
    assert resp.status_code == 409 and "RUNNING" in resp.get_data(as_text=True)
    admin.post(f"/messages/{msg_id}/delete")
    after = storage.reads.get_message(msg_id)
    assert after.status == "RUNNING" and after.lease_token == held.lease_token and after.data == '{"a": 1}'


def test_edit_of_workflow_steps_names_what_may_not_be_set_and_releases_dependents(admin, storage):
    from tidemq import clock
    from tidemq_broker.storage import NewRow, WorkflowStep

    row = NewRow(topic="orders", data='{"a": 1}', effect_time=clock.now(), retry_remaining=0)
    parent, child = storage.dependencies.insert_steps([WorkflowStep(row, (), ()), WorkflowStep(row, (), (0,))],
                                                      clock.now(), broker="b1")
    form = admin.get(f"/messages/{child}/edit").get_data(as_text=True)
    assert '<option value="WAITING" selected>' in form
    assert "WAITING" not in admin.get(f"/messages/{parent}/edit").get_data(as_text=True).split("<select")[1]
    resp = _edit(admin, storage.reads.get_message(parent), status="WAITING")
    assert resp.status_code == 400 and "WAITING is set by dependencies only" in resp.get_data(as_text=True)
    assert storage.reads.get_message(parent).status == "NEW"
    assert _edit(admin, storage.reads.get_message(parent), status="SUCCESS").status_code == 302
    assert storage.reads.get_message(child).status == "NEW"  # released as an ack's SUCCESS would
    resp = _edit(admin, storage.reads.get_message(parent), status="NEW")
    assert resp.status_code == 400 and "others depend on it" in resp.get_data(as_text=True)


def test_retry_moves_fail_to_new_and_names_the_admin(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    fail_all(storage, "orders")
    resp = admin.post(f"/messages/{msg_id}/retry", {"retries": "2"})
    assert resp.status_code == 302
    msg = storage.reads.get_message(msg_id)
    assert msg.status == "NEW" and msg.retry_remaining == 2
    assert "ADMIN_RETRY" in msg.trace and f"user={ADMIN}" in msg.trace
    again = admin.post(f"/messages/{msg_id}/retry", {"retries": "2"}, follow_redirects=True)
    assert "only FAIL messages can be" in again.get_data(as_text=True)


def test_requeue_all_failed_across_topics(admin, storage):
    produce(storage, "orders", ['{"o": 1}', '{"o": 2}'])
    produce(storage, "sms", ['{"s": 1}'])
    failed = fail_all(storage, "orders") + fail_all(storage, "sms")
    [kept] = produce(storage, "sms", ['{"s": 2}'], delay=3600)
    resp = admin.post("/messages/requeue", {"status": "FAIL", "retries": "1"}, follow_redirects=True)
    assert "Requeued 3 failed messages across all topics" in resp.get_data(as_text=True)
    for msg_id in failed:
        msg = storage.reads.get_message(msg_id)
        assert msg.status == "NEW" and msg.retry_remaining == 1 and "ADMIN_REQUEUE" in msg.trace
    assert "ADMIN" not in storage.reads.get_message(kept).trace


def test_requeue_by_filter_touches_only_matching_failures(admin, storage):
    produce(storage, "orders", ['{"region": "eu"}', '{"region": "us"}'])
    produce(storage, "sms", ['{"region": "eu"}'])
    eu_order, us_order = fail_all(storage, "orders")
    [eu_sms] = fail_all(storage, "sms")
    resp = admin.post("/messages/requeue", {"topic": "orders", "text": "eu", "status": "FAIL"}, follow_redirects=True)
    assert "Requeued 1 failed message of topic orders" in resp.get_data(as_text=True)
    assert storage.reads.get_message(eu_order).status == "NEW"
    assert storage.reads.get_message(us_order).status == "FAIL"
    assert storage.reads.get_message(eu_sms).status == "FAIL"


def test_requeue_refuses_a_non_fail_status_filter(admin, storage):
    produce(storage, "orders", ['{"o": 1}'])
    fail_all(storage, "orders")
    assert admin.post("/messages/requeue", {"status": "SUCCESS"}).status_code == 400


def test_poison_messages_failed_by_lease_expiry_are_dead_letters_to_requeue(admin, storage):
    """A message whose consumer dies on every delivery ends in FAIL by lease expiry: the dead
    letters list it with its reason next to ordinary failures, and bulk requeue moves it."""
    produce(storage, "orders", ['{"poison": 1}', '{"poison": 2}', '{"poison": 3}'])
    produce(storage, "sms", ['{"ok": 1}'])
    poisoned = poison_all(storage, "orders")
    [failed] = fail_all(storage, "sms")
    reason = "_max_deliveries_1_reached"
    for msg_id in poisoned:
        msg = storage.reads.get_message(msg_id)
        assert msg.status == "FAIL" and msg.lease_expire is None and reason in msg.trace.splitlines()[-1]
    html = admin.get("/messages?status=FAIL").get_data(as_text=True)
    assert {i for i in poisoned + [failed] if f'href="/messages/{i}"' in html} == set(poisoned + [failed])
    assert html.count(reason) == 3 and "Failed with" in html and ">boom</td>" in html
    assert reason in admin.get(f"/messages/{poisoned[0]}").get_data(as_text=True)

    resp = admin.post("/messages/bulk", {"ids": [str(i) for i in poisoned[:2]], "action": "requeue", "retries": "1"},
                      follow_redirects=True)
    assert "Requeued 2 of 2 selected messages." in resp.get_data(as_text=True)
    for msg_id in poisoned[:2]:
        msg = storage.reads.get_message(msg_id)
        assert msg.status == "NEW" and msg.retry_remaining == 1
        assert "ADMIN_RETRY" in msg.trace.splitlines()[-1] and f"user={ADMIN}" in msg.trace.splitlines()[-1]
    resp = admin.post("/messages/requeue", {"status": "FAIL", "topic": "orders"}, follow_redirects=True)
    assert "Requeued 1 failed message of topic orders" in resp.get_data(as_text=True)
    assert storage.reads.get_message(poisoned[2]).status == "NEW" and storage.reads.get_message(failed).status == "FAIL"


def test_bulk_delete_and_requeue_of_the_selection(admin, storage):
    ids = produce(storage, "orders", ['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}'])
    failed = fail_all(storage, "orders", limit=2)
    pending = [i for i in ids if i not in failed]
    resp = admin.post("/messages/bulk", {"ids": [str(failed[0]), str(pending[0]), "1 OR 1=1"], "action": "delete"},
                      follow_redirects=True)
    assert "Deleted 2 of 2 selected messages" in resp.get_data(as_text=True)
    assert storage.reads.get_message(failed[0]) is None and storage.reads.get_message(pending[0]) is None
    resp = admin.post("/messages/bulk", {"ids": [str(failed[1]), str(pending[1])], "action": "requeue"},
                      follow_redirects=True)
    assert "Requeued 1 of 2 selected" in resp.get_data(as_text=True)
    assert storage.reads.get_message(failed[1]).status == "NEW"
    nothing = admin.post("/messages/bulk", {"action": "delete"}, follow_redirects=True)
    assert "Select messages first" in nothing.get_data(as_text=True)


def test_cancel_deletes_a_pending_message_and_refuses_a_finished_one(admin, storage):
    [pending] = produce(storage, "orders", ['{"a": 1}'], delay=3600)
    [done] = produce(storage, "sms", ['{"a": 1}'])
    fail_all(storage, "sms")
    admin.post(f"/messages/{pending}/cancel")
    assert storage.reads.get_message(pending) is None
    resp = admin.post(f"/messages/{done}/cancel", follow_redirects=True)
    assert "only NEW (pending) and RUNNING messages can be" in resp.get_data(as_text=True)
    assert storage.reads.get_message(done).status == "FAIL"


def test_cancel_of_a_running_message_marks_it_traced_and_signals_its_topics_workers(admin, storage, settings):
    [running] = produce(storage, "reports", ['{"a": 1}'])
    lease_all(storage, "reports")
    page = admin.get(f"/messages/{running}").get_data(as_text=True)
    assert 'id="cancel"' in page  # offered for a RUNNING message
    with cancel_signals(settings, "reports", "orders") as (heard, elsewhere):
        resp = admin.post(f"/messages/{running}/cancel", follow_redirects=True)
        assert "its cancel is requested. Its worker learns of it now" in resp.get_data(as_text=True)
        assert heard.wait(10), "the topic's workers were not signalled"
        assert not elsewhere.is_set()
    msg = storage.reads.get_message(running)
    assert (msg.status, msg.cancel_requested) == ("RUNNING", True)
    assert "CANCEL_REQUESTED" in msg.trace and f"user={ADMIN}" in msg.trace
    assert 'id="cancel"' not in admin.get(f"/messages/{running}").get_data(as_text=True)  # requested once


def test_cancel_of_a_running_message_with_zookeeper_away_is_stored_and_says_when_its_worker_learns(mysql_url):
    """The request waits for the signal a moment, not for a session that cannot start: the mark is
    stored, and the page says the worker learns of it at its next heartbeat at the latest."""
    from tidemq_admin import create_app

    settings = Settings.from_env({}, db_url=mysql_url, zk_hosts=f"127.0.0.1:{free_port()}", admin_user=ADMIN,
                                 admin_password=PASSWORD)
    app = create_app(settings)
    console = app.extensions["tidemq"]
    try:
        [running] = produce(console.storage, "reports", ['{"a": 1}'])
        lease_all(console.storage, "reports")
        page = Browser(app, ADMIN).post(f"/messages/{running}/cancel", follow_redirects=True).get_data(as_text=True)
        assert "Its worker learns of it at its next heartbeat at the latest" in page
        assert console.storage.reads.get_message(running).cancel_requested
    finally:
        console.cluster.close()
        console.storage.close()


def test_produce_a_test_message(admin, storage):
    resp = admin.post("/messages/new", {"topic": "console.test", "data": '{"hello": "world"}', "delay": "60",
                                        "retry": "2", "unique_key": "t-1"})
    assert resp.status_code == 302
    [msg] = list_messages(storage, MessageFilter(topic="console.test"), 10)
    assert msg.data == '{"hello": "world"}' and msg.retry_remaining == 2 and msg.unique_key == "t-1"
    assert (msg.effect_time - msg.add_time).total_seconds() == 60
    assert f"user={ADMIN}" in msg.trace
    assert "console.test" in [t.name for t in storage.topics.list_topics()]


def test_produce_rejects_bad_input_naming_the_rule(admin, storage):
    resp = admin.post("/messages/new", {"topic": "bad topic!", "data": "nope", "delay": "-5", "retry": "x"})
    assert resp.status_code == 400
    html = resp.get_data(as_text=True)
    assert "characters outside [A-Za-z0-9._:-]" in html
    assert ("valid JSON" in html and "delay (seconds) must be between 0" in html
            and "retries must be a whole number" in html)
    assert list_messages(storage, MessageFilter(), 10) == []


def test_numbers_outside_their_range_or_not_ascii_are_400_and_change_nothing(admin, viewer, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    fail_all(storage, "orders")
    before = storage.reads.get_message(msg_id)
    for retries in ("²", "٣", "1" * 20, "-1", "1e3"):
        assert admin.post(f"/messages/{msg_id}/retry", {"retries": retries}).status_code == 400, retries
        assert admin.post("/messages/bulk", {"ids": [str(msg_id)], "action": "requeue",
                                             "retries": retries}).status_code == 400, retries
    for version in ("²", "9" * 20):
        resp = admin.post(f"/messages/{msg_id}/edit", {"version": version, "data": '{"a": 2}',
                                                      "status": "FAIL", "retry_remaining": "0"})
        assert resp.status_code == 400, version
    assert storage.reads.get_message(msg_id) == before
    for who in (admin, viewer):  # viewers can page too
        for before_id in ("²", "9" * 25, "-5"):
            assert who.get(f"/messages?before={before_id}").status_code == 200
    for huge in (2**63, 10**25):
        assert admin.get(f"/messages/{huge}").status_code == 404
        assert admin.post(f"/messages/{huge}/retry", {"retries": "1"}).status_code == 404
    assert admin.post("/messages/bulk", {"ids": [str(2**63), str(msg_id)], "action": "requeue",
                                         "retries": "1"}).status_code == 302
    assert storage.reads.get_message(msg_id).status == "NEW"  # the valid id was retried, the other ignored
