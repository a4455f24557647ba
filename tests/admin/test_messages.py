"""Listing, filtering, paging and reading messages; hostile input changes nothing."""

from __future__ import annotations

import json

from tests.admin.conftest import fail_all, lease_all, produce


def test_failed_messages_of_all_topics_are_listed_together(admin, storage):
    produce(storage, "orders", ['{"o": 1}', '{"o": 2}'])
    produce(storage, "sms", ['{"s": 1}'])
    failed = fail_all(storage, "orders", limit=1) + fail_all(storage, "sms")
    html = admin.get("/messages?status=FAIL").get_data(as_text=True)
    for msg_id in failed:
        assert f'href="/messages/{msg_id}"' in html
    assert html.count('class="msg-link"') == 2
    assert "of <b>all topics</b>" in html  # the requeue-all bar covers every topic


def test_filters_by_topic_id_unique_key_and_text(admin, storage):
    a = produce(storage, "orders", ['{"customer": "alice"}', '{"customer": "bob"}'], unique_keys=["k-a", "k-b"])
    b = produce(storage, "sms", ['{"to": "alice"}'])

    def ids(query):
        html = admin.get("/messages?" + query).get_data(as_text=True)
        return {i for i in a + b if f'href="/messages/{i}"' in html}

    assert ids("topic=orders") == set(a)
    assert ids(f"id={b[0]}") == {b[0]}
    assert ids("unique_key=k-b") == {a[1]}  # across topics: no topic given
    assert ids("text=alice") == {a[0], b[0]}
    assert ids("topic=sms&text=alice") == {b[0]}
    assert ids("added_from=2000-01-01&added_to=2100-01-01") == set(a + b)
    assert ids("effect_to=2000-01-01") == set()


def test_bad_filter_values_are_named_next_to_the_field(admin, storage):
    html = admin.get("/messages?id=abc&status=LOST&effect_from=yesterday&topic=bad topic!").get_data(as_text=True)
    assert 'id="err-id"' in html and "id must be a whole number" in html
    assert 'id="err-status"' in html and "status must be one of NEW, RUNNING, SUCCESS, FAIL" in html
    assert 'id="err-effect_from"' in html and "expected a UTC time like" in html
    assert 'id="err-topic"' in html


def test_sql_in_filters_is_only_text(admin, storage):
    ids = produce(storage, "orders", ['{"a": 1}', '{"a": 2}'])
    for query in ["text=%27%3B%20DROP%20TABLE%20tidemq_message%3B--", "unique_key=x%27%20OR%20%271%27%3D%271",
                  "text=%25", "text=_", "topic=orders%27%20OR%201%3D1--"]:
        resp = admin.get("/messages?" + query)
        assert resp.status_code == 200
        assert 'class="msg-link"' not in resp.get_data(as_text=True), query
    assert all(storage.reads.get_message(i) is not None for i in ids)


def test_keyset_pages_walk_every_message_once(admin, storage):
    ids = produce(storage, "orders", [json.dumps({"n": i}) for i in range(120)])
    seen, path, pages = [], "/messages?topic=orders", 0
    while path:
        html = admin.get(path).get_data(as_text=True)
        seen += [i for i in ids if f'href="/messages/{i}"' in html]
        pages += 1
        marker = 'class="next"'
        if marker not in html:
            break
        start = html.rindex('href="', 0, html.index(marker)) + 6
        path = html[start:html.index('"', start)].replace("&amp;", "&")
    assert pages == 3
    assert sorted(seen) == sorted(ids) and len(seen) == 120


def test_script_in_data_is_shown_escaped(admin, storage):
    evil = json.dumps({"html": "<script>alert(1)</script><img src=x onerror=alert(2)>"})
    [msg_id] = produce(storage, "evil.topic", [evil])
    for path in ["/messages", f"/messages/{msg_id}", f"/messages/{msg_id}/edit"]:
        html = admin.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path


def test_detail_shows_fields_pretty_json_and_full_trace(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"order_id":42,"items":[1,2]}'], retry=0)
    fail_all(storage, "orders")
    html = admin.get(f"/messages/{msg_id}").get_data(as_text=True)
    assert '&#34;order_id&#34;: 42' in html or '"order_id": 42' in html
    assert "PRODUCED" in html and "LOCKED" in html and "FAIL" in html
    assert "test-consumer" in html and "boom" in html


def test_missing_message_is_a_clear_404(admin):
    resp = admin.get("/messages/987654321")
    assert resp.status_code == 404
    assert "does not exist" in resp.get_data(as_text=True)


def test_empty_store_says_what_to_do(admin):
    html = admin.get("/messages").get_data(as_text=True)
    assert "No messages stored yet" in html and "tidemq produce" in html
    assert "No topics yet" in admin.get("/").get_data(as_text=True)


def test_running_messages_show_their_consumer(admin, storage):
    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    lease_all(storage, "orders")
    html = admin.get(f"/messages/{msg_id}").get_data(as_text=True)
    assert "RUNNING" in html and "test-consumer" in html
    assert f"/messages/{msg_id}/edit" not in html  # no edit button while a consumer holds it


def test_detail_shows_the_producer_s_trace_id(admin, storage):
    from tidemq import clock
    from tidemq_broker.storage import NewRow

    now = clock.now()
    [msg_id] = storage.messages.insert_messages([NewRow("orders", "{}", now, 0, trace_context=(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))], now)
    html = admin.get(f"/messages/{msg_id}").get_data(as_text=True)
    assert "0af7651916cd43dd8448eb211c80319c" in html


def test_the_message_page_shows_the_result_the_error_and_progress_and_the_json_endpoint(admin, storage):
    from tidemq import clock
    from tidemq_broker.storage import AckItem, LockRequest, Shard, TopicSettings

    ids = produce(storage, "jobs", ['{"a": 1}', '{"a": 2}', '{"a": 3}'])
    leased = storage.leases.lock_batch(LockRequest(Shard("jobs"), "test-consumer", 30, clock.now(), limit=3))
    by_id = {m.id: m for m in leased}
    done, failed, running = ids
    error = json.dumps({"type": "app.QuotaError", "message": "over <quota>", "traceback": "Traceback: line 9"})
    storage.acks.ack([AckItem(done, by_id[done].lease_token, True, result='{"rows": 42}'),
                      AckItem(failed, by_id[failed].lease_token, False, "over quota", error)], clock.now(),
                     "test-consumer", "b", lambda name: TopicSettings(name, retry_count=0))
    storage.leases.report_progress([(running, by_id[running].lease_token,
                                     '{"done": 3, "total": 10, "note": "rows", "at": 1}')], clock.now())
    html = admin.get(f"/messages/{done}").get_data(as_text=True)
    assert 'id="result"' in html and ("&#34;rows&#34;: 42" in html or '"rows": 42' in html)
    html = admin.get(f"/messages/{failed}").get_data(as_text=True)
    assert "app.QuotaError" in html and "over &lt;quota&gt;" in html and "Traceback: line 9" in html
    html = admin.get(f"/messages/{running}").get_data(as_text=True)
    assert '<progress max="10" value="3">' in html and "3 / 10" in html and "— rows" in html
    api = admin.get(f"/messages/{failed}/result").get_json()
    assert (api["status"], api["error"]["type"], api["result"]) == ("FAIL", "app.QuotaError", None)
    assert admin.get(f"/messages/{done}/result").get_json()["result"] == {"rows": 42}
    assert admin.get(f"/messages/{running}/result").get_json()["progress"]["done"] == 3
    assert admin.get("/messages/987654321/result").status_code == 404


def test_a_topics_retained_results_are_listed_newest_first_and_paged(admin, storage):
    from tidemq import clock
    from tidemq_broker.storage import AckItem, LockRequest, Shard, TopicSettings
    from tidemq_admin.views.messages import PAGE_SIZE

    ids = produce(storage, "reports", [f'{{"n": {i}}}' for i in range(PAGE_SIZE + 2)])
    leased = storage.leases.lock_batch(LockRequest(Shard("reports"), "c", 30, clock.now(), limit=len(ids)))
    error = json.dumps({"type": "app.Broken", "message": "no <data>", "traceback": ""})
    storage.acks.ack([AckItem(m.id, m.lease_token, m.id != ids[0], "no data", error if m.id == ids[0] else None)
                      if m.id == ids[0] else AckItem(m.id, m.lease_token, True, result=f'{{"n": {m.id}}}')
                      for m in leased], clock.now(), "c", "b", lambda name: TopicSettings(name, retry_count=0))
    html = admin.get("/topics/reports/results").get_data(as_text=True)
    assert html.index(f">{ids[-1]}</a>") < html.index(f">{ids[-2]}</a>") and 'id="older"' in html
    assert f">{ids[0]}</a>" not in html
    older = admin.get(f"/topics/reports/results?before={ids[2]}").get_data(as_text=True)
    assert f">{ids[0]}</a>" in older and "app.Broken: no &lt;data&gt;" in older and f">{ids[1]}</a>" in older
    assert admin.get("/topics/no%20such/results").status_code == 400
    assert "Results" in admin.get("/topics").get_data(as_text=True)
