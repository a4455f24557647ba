"""The operator's path through the console in real headless Chromium, checked in the database."""

from __future__ import annotations

import json

from tidemq import clock
from tidemq.coordinators.zookeeper import ZooKeeperCoordinator
from tidemq_broker.schema import topic_stats
from tidemq_broker.storage import hours_ago

from tests.admin.conftest import fail_all, produce
from tests.browser.conftest import ADMIN, PASSWORD, VIEWER, sign_in
from tests.servers import wait_until


def _stats(db, topic):
    now = clock.now()
    rows = [{"topic": topic, "hour": hours_ago(now, h), "produced": 400 + 37 * (h % 5), "succeeded": 380 + 30 * (h % 4),
             "failed": (h * 7) % 13, "retried": 3, "lease_expired": 0, "backlog": 20, "lateness_p50_ms": 4.0 + h % 3,
             "lateness_p95_ms": 15.0 + (h % 6), "lateness_p99_ms": 30.0 + (h % 9), "duration_p50_ms": None,
             "duration_p95_ms": None, "duration_p99_ms": None, "computed_at": now} for h in range(30)]
    with db.engine.begin() as conn:  # stands in for the pipeline's report job
        conn.execute(topic_stats.insert(), rows)


def test_login_is_required_and_wrong_password_is_refused(console, page, shots):
    page.goto(console.base_url + "/messages?status=FAIL")
    assert "/login" in page.url
    shots(page, "login")
    page.fill("input[name=name]", ADMIN)
    page.fill("input[name=password]", "wrong-password")
    page.click("button[type=submit]")
    assert page.inner_text(".field-error") == "Wrong user name or password."
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('Messages')")
    assert page.url.endswith("/messages?status=FAIL")
    page.click("text=Sign out")
    page.wait_for_selector("form.login")


def test_find_and_requeue_failed_messages_of_all_topics(console, page, shots, mysql_db):
    storage = console.extensions["tidemq"].storage
    produce(storage, "orders.close", [json.dumps({"order_id": i}) for i in range(3)])
    produce(storage, "sms.send", [json.dumps({"to": f"+4912345{i}"}) for i in range(2)])
    produce(storage, "sms.send", ['{"to": "later"}'], delay=3600)
    failed = fail_all(storage, "orders.close", limit=2) + fail_all(storage, "sms.send")
    _stats(mysql_db, "orders.close")
    sign_in(page, console.base_url)
    page.wait_for_selector("svg.chart")
    shots(page, "dashboard")
    page.click("header nav >> text=Failed")
    page.wait_for_selector("table.messages")
    listed = {int(t) for t in page.locator("a.msg-link").all_inner_texts()}
    assert listed == set(failed)
    shots(page, "messages-failed")
    page.click("#requeue-all button[type=submit]")
    page.wait_for_selector(".flash.ok")
    assert "Requeued 4 failed messages across all topics" in page.inner_text(".flash.ok")
    for msg_id in failed:
        msg = storage.reads.get_message(msg_id)
        assert msg.status == "NEW" and f"user={ADMIN}" in msg.trace


def test_filter_open_edit_and_see_the_trace(console, page, shots):
    storage = console.extensions["tidemq"].storage
    ids = produce(storage, "orders.close", [json.dumps({"order_id": i, "customer": f"cust-{i}"}) for i in range(5)],
                  delay=600)
    sign_in(page, console.base_url)
    page.goto(console.base_url + "/messages")
    page.fill("input[name=text]", "cust-3")
    page.select_option("select[name=status]", "NEW")
    page.click("#filters button[type=submit]")
    page.wait_for_selector("table.messages")
    assert page.locator("a.msg-link").all_inner_texts() == [str(ids[3])]
    page.click("a.msg-link")
    page.wait_for_selector("pre#data")
    assert '"customer": "cust-3"' in page.inner_text("pre#data")
    shots(page, "message-detail")
    page.click("text=Edit")
    page.wait_for_selector("textarea[name=data]")
    page.fill("textarea[name=data]", "{not json")
    page.click("button:has-text('Save')")
    assert "valid JSON" in page.inner_text("#err-data")
    assert storage.reads.get_message(ids[3]).data == json.dumps({"order_id": 3, "customer": "cust-3"})
    page.fill("textarea[name=data]", '{"order_id": 3, "customer": "cust-3", "vip": true}')
    page.fill("input[name=retry_remaining]", "7")
    shots(page, "message-edit")
    page.click("button:has-text('Save')")
    page.wait_for_selector("table#trace")
    msg = storage.reads.get_message(ids[3])
    assert json.loads(msg.data) == {"order_id": 3, "customer": "cust-3", "vip": True}
    assert msg.retry_remaining == 7
    trace_text = page.inner_text("table#trace")
    assert "ADMIN_EDIT" in trace_text and ADMIN in trace_text and "PRODUCED" in trace_text


def test_retry_one_failed_message_from_its_page(console, page):
    storage = console.extensions["tidemq"].storage
    [msg_id] = produce(storage, "orders.close", ['{"order_id": 99}'])
    fail_all(storage, "orders.close")
    sign_in(page, console.base_url)
    page.goto(f"{console.base_url}/messages/{msg_id}")
    assert page.inner_text("h1 .badge") == "FAIL"
    page.fill("input[name=retries]", "2")
    page.click("#retry")
    page.wait_for_selector(".flash.ok")
    assert page.inner_text("h1 .badge") == "NEW"
    msg = storage.reads.get_message(msg_id)
    assert msg.status == "NEW" and msg.retry_remaining == 2 and "ADMIN_RETRY" in msg.trace


def test_script_in_data_does_not_run(console, page):
    storage = console.extensions["tidemq"].storage
    evil = json.dumps({"x": "<script>alert('list')</script>", "y": "<img src=x onerror=alert('img')>"})
    [msg_id] = produce(storage, "evil", [evil])
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(page, console.base_url)
    page.goto(console.base_url + "/messages?topic=evil")
    page.wait_for_selector("table.messages")
    assert "<script>alert('list')</script>" in page.inner_text("td.data")
    page.goto(f"{console.base_url}/messages/{msg_id}")
    page.wait_for_selector("pre#data")
    assert "<img src=x onerror=alert('img')>" in page.inner_text("pre#data")
    assert dialogs == []
    assert page.locator("img").count() == 0


def test_viewer_sees_no_actions_and_forged_posts_change_nothing(console, page):
    storage = console.extensions["tidemq"].storage
    [msg_id] = produce(storage, "orders.close", ['{"order_id": 5}'])
    fail_all(storage, "orders.close")
    sign_in(page, console.base_url, VIEWER)
    page.goto(f"{console.base_url}/messages/{msg_id}")
    assert page.locator("#retry").count() == 0 and page.locator("text=Edit").count() == 0
    forged = page.evaluate("""async (id) => {
        const noToken = await fetch('/messages/' + id + '/delete', {method: 'POST'});
        const html = await (await fetch('/messages')).text();
        const token = html.match(/name="csrf_token" value="([^"]+)"/)[1];
        const body = new URLSearchParams({csrf_token: token});
        const asViewer = await fetch('/messages/' + id + '/delete', {method: 'POST', body});
        return [noToken.status, asViewer.status];
    }""", msg_id)
    assert forged == [400, 403]
    assert storage.reads.get_message(msg_id).status == "FAIL"


def test_topics_and_cluster_pages(console, page, shots, zk_hosts):
    storage = console.extensions["tidemq"].storage
    produce(storage, "orders.close", ['{"a": 1}'])
    produce(storage, "sms.send", ['{"a": 1}'])
    zk = ZooKeeperCoordinator(zk_hosts, console.extensions["tidemq"].settings.zk_root)
    zk.start()
    try:
        zk.register_broker("127.0.0.1:50051")
        zk.register_broker("127.0.0.1:50052")
        for instance in ("worker-a-101", "worker-b-202", "worker-c-303"):
            zk.register_consumer("orders.close", instance)
        zk.register_consumer("sms.send", "worker-a-101")
        sign_in(page, console.base_url)
        page.goto(console.base_url + "/topics")
        page.click("#topic-orders\\.close >> text=Pause")
        page.wait_for_selector(".flash.ok")
        assert next(t for t in storage.topics.list_topics() if t.name == "orders.close").paused
        page.click("#topic-orders\\.close >> text=Edit")
        page.fill("input[name=ttr]", "0")
        page.click("button:has-text('Save')")
        assert "time to run (seconds) must be between 1" in page.inner_text("#err-ttr")
        page.fill("input[name=ttr]", "45")
        page.click("button:has-text('Save')")
        page.wait_for_selector(".flash.ok")
        assert next(t for t in storage.topics.list_topics() if t.name == "orders.close").ttr == 45
        shots(page, "topics")

        def listed():
            page.goto(console.base_url + "/cluster")
            return "127.0.0.1:50052" in page.inner_text("#brokers")

        wait_until(listed, 15, interval=0.2, what="brokers on the cluster page")
        consumers = page.inner_text("#consumers")
        assert "worker-c-303" in consumers and "2 / 3" in consumers
        shots(page, "cluster")
    finally:
        zk.stop()


def test_the_dashboard_refreshes_its_figures_without_a_reload(console, page):
    storage = console.extensions["tidemq"].storage
    produce(storage, "live.orders", [json.dumps({"n": i}) for i in range(2)])
    sign_in(page, console.base_url)
    page.goto(console.base_url + "/")
    tile = ".tile.t-new .n"
    assert page.inner_text(tile) == "2"
    page.evaluate("window.__notReloaded = true")
    produce(storage, "live.orders", [json.dumps({"n": i}) for i in range(3)])
    wait_until(lambda: page.inner_text(tile) == "5", 15, 0.2, "the dashboard to show 5 NEW")
    assert page.evaluate("window.__notReloaded") is True  # the figures changed in place
    assert "5" in page.inner_text("#topic-live\\.orders .counts")
