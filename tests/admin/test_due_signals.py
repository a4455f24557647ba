"""The console's changes that make messages due without a new id (a retry, a requeue, an edit to
NEW, the steps a cancel, a delete or an edit releases) are signalled to the brokers through
ZooKeeper, as a broker's release is: the brokers' insert watches see only new ids, so their
waiting pulls would otherwise find such a message by their earliest-due probe, up to about a
second later. The signals are watched here as a broker watches them (``watch_signal``)."""

from __future__ import annotations

import logging
from typing import Callable

import pytest

from tests.admin.conftest import ADMIN, PASSWORD, Browser, due_signals, edit_form, fail_all, produce
from tests.background import InThread
from tests.servers import free_port, wait_until
from tidemq import BatchConsumer, Settings, clock
from tidemq.dependencies import WaitMode
from tidemq_broker.storage import NewRow, WorkflowStep

DUE, OTHER = "reports", "orders"  # what becomes due is of DUE; what the change touches besides, of OTHER


def _failed(storage) -> int:
    produce(storage, DUE, ['{"a": 1}'])
    [failed] = fail_all(storage, DUE)
    return failed


def _waited_on(storage) -> int:
    """A step of OTHER that another workflow's step of DUE waits on whatever its outcome (as
    a clean-up step does): ending or removing it releases that step."""
    now = clock.now()
    [parent] = storage.dependencies.insert_steps([WorkflowStep(NewRow(OTHER, "{}", now, 0))], now, broker="b1")
    storage.dependencies.insert_steps([WorkflowStep(NewRow(DUE, "{}", now, 0), (parent,),
                                                    wait_mode=WaitMode.AFTER_COMPLETE)], now, broker="b1")
    return parent


# Each: (make the message the change acts on, the console's request for it).
CHANGES: dict[str, tuple[Callable, Callable]] = {
    "retry": (_failed, lambda admin, storage, id: admin.post(f"/messages/{id}/retry")),
    "bulk requeue": (_failed, lambda admin, storage, id: admin.post("/messages/bulk", {"ids": [str(id)],
                                                                                        "action": "requeue"})),
    "requeue matching": (_failed, lambda admin, storage, id: admin.post("/messages/requeue", {"status": "FAIL"})),
    "edit to NEW": (_failed, lambda admin, storage, id: admin.post(
        f"/messages/{id}/edit", edit_form(storage.reads.get_message(id), status="NEW"))),
    "edit that releases": (_waited_on, lambda admin, storage, id: admin.post(
        f"/messages/{id}/edit", edit_form(storage.reads.get_message(id), status="SUCCESS"))),
    "cancel that releases": (_waited_on, lambda admin, storage, id: admin.post(f"/messages/{id}/cancel")),
    "delete that releases": (_waited_on, lambda admin, storage, id: admin.post(f"/messages/{id}/delete")),
    "bulk delete that releases": (_waited_on, lambda admin, storage, id: admin.post(
        "/messages/bulk", {"ids": [str(id)], "action": "delete"})),
    "workflow cancel that releases": (_waited_on, lambda admin, storage, id: admin.post(f"/workflows/{id}/cancel")),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_that_makes_a_message_due_signals_its_topic_to_the_brokers(change, admin, storage, settings):
    make, request = CHANGES[change]
    acted_on = make(storage)
    with due_signals(settings, DUE, OTHER) as (heard, elsewhere):
        assert request(admin, storage, acted_on).status_code == 302
        assert heard.wait(10), f"the brokers were not told that a message of {DUE} is due"
        assert not elsewhere.is_set()  # what the change ended or removed is not due
    assert storage.counts.count_by_status(DUE) == {DUE: {"NEW": 1}}  # and it is due indeed


def test_a_message_edited_to_new_at_its_old_time_reaches_a_pull_waiting_on_a_broker(admin, storage, broker, client):
    """The broker's probe and its pulls' recheck are off, so only the console's signal can wake
    the pull. The message was due a minute ago (an edit keeps its effect time), below the shard's
    cursor the broker's locks left: the signal makes the broker forget it (``UNTIMED``), or the
    woken lock would read past the message and the pull would end empty at its deadline."""
    broker.hub._earliest_every, broker.hub.recheck = 10**9, 600.0
    produce(storage, DUE, ['{"a": 1}'], delay=-60)
    [failed] = fail_all(storage, DUE)
    consumer = BatchConsumer(DUE, client=client)

    def cursor_at_due_by() -> bool:  # as tests/integration/test_lock_hints.py reads it
        assert consumer.pull(max_messages=1, wait=0) == []
        cursor = broker.hub.hints.get(DUE).floor_of(0)
        return cursor is not None and cursor > clock.after(clock.now(), -1)

    wait_until(cursor_at_due_by, 10, what="the shard's cursor at its due-by time")
    waiting = InThread(lambda: consumer.pull(max_messages=1, wait=30.0))
    wait_until(lambda: broker.hub.waiting(DUE) == 1, 10, what="the pull waiting on the broker")
    edited = admin.post(f"/messages/{failed}/edit", edit_form(storage.reads.get_message(failed), status="NEW"))
    assert edited.status_code == 302
    [got] = waiting.value(40)
    assert got.id == failed


def test_with_zookeeper_away_changes_are_stored_and_the_lost_signals_logged_once(mysql_url, caplog):
    """The signals go from a thread of their own: a retry does not wait for ZooKeeper (nor for a
    connection that cannot start), and an outage is one warning, not one per signal."""
    from tidemq_admin import create_app

    settings = Settings.from_env({}, db_url=mysql_url, zk_hosts=f"127.0.0.1:{free_port()}", admin_user=ADMIN,
                                 admin_password=PASSWORD)
    app = create_app(settings)
    console = app.extensions["tidemq"]
    cluster, tried = console.cluster, []
    send = cluster._send_due
    cluster._send_due = lambda topic: (tried.append(topic), send(topic))  # counted; the sender starts later
    try:
        admin = Browser(app, ADMIN)
        with caplog.at_level(logging.INFO, logger="tidemq_admin.console"):
            for _ in range(2):
                failed = _failed(console.storage)
                page = admin.post(f"/messages/{failed}/retry", follow_redirects=True).get_data(as_text=True)
                assert f"Message {failed} is NEW again and due now." in page
                assert console.storage.reads.get_message(failed).status == "NEW"
                console.storage.messages.delete_messages([failed])
                wait_until(lambda: len(tried) >= 1, 30, what="a signal tried")  # not merged with the next one
            wait_until(lambda: len(tried) >= 2, 30, what="the second signal tried")
        lost = [r for r in caplog.records if r.getMessage().startswith("cannot tell the brokers")]
        assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    finally:
        cluster.close()
        console.storage.close()
