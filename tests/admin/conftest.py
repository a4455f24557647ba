"""Console fixtures: a Flask app on the real MariaDB (per-test truncated), users, messages."""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from typing import ContextManager, Iterator

import pytest

from tidemq import clock
from tidemq.config import Settings
from tidemq_broker.storage import AckItem, LockRequest, NewRow, Shard, TopicSettings

ADMIN, VIEWER, PASSWORD = "ops", "watcher", "correct-horse-9"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def settings(mysql_url, zk_hosts):
    return Settings.from_env({}, db_url=mysql_url, zk_hosts=zk_hosts, admin_user=ADMIN, admin_password=PASSWORD)


@pytest.fixture
def app(settings):
    from tidemq_admin import create_app
    from tidemq_admin.accounts import add_user

    app = create_app(settings)
    add_user(app.extensions["tidemq"].storage.console, VIEWER, PASSWORD, "viewer")
    yield app
    console = app.extensions["tidemq"]
    console.cluster.close()
    console.storage.close()


@pytest.fixture
def storage(app):
    return app.extensions["tidemq"].storage


@contextmanager
def _signals(settings: Settings, watch: str, topic: str,
             other: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Watch the signals of ``topic`` and of ``other`` through the coordinator's ``watch`` method
    on the console's ZooKeeper; yields (heard for topic, heard for other), both clear."""
    from tidemq.coordinators import open_coordinator

    watcher = open_coordinator(settings.zk_hosts, settings.zk_root, settings.zk_session_timeout)
    watcher.start(timeout=10)
    heard, elsewhere = threading.Event(), threading.Event()
    try:
        getattr(watcher, watch)(topic, lambda *sender: heard.set())
        getattr(watcher, watch)(other, lambda *sender: elsewhere.set())
        assert heard.wait(10) and elsewhere.wait(10)  # the watches' first call, at their start
        heard.clear()
        elsewhere.clear()
        yield heard, elsewhere
    finally:
        watcher.stop()


def cancel_signals(settings: Settings, topic: str,
                   other: str) -> ContextManager[tuple[threading.Event, threading.Event]]:
    """The cancel signals of two topics, watched as a runner's lease keeper does (``_signals``)."""
    return _signals(settings, "watch_cancels", topic, other)


def due_signals(settings: Settings, topic: str, other: str) -> ContextManager[tuple[threading.Event, threading.Event]]:
    """The release signals of two topics, watched as a broker's pulls do (``_signals``)."""
    return _signals(settings, "watch_signal", topic, other)


def edit_form(msg, **changes: str) -> dict[str, str]:
    """The message edit page's form for stored ``msg``, its fields as the page fills them, with ``changes``."""
    form = {"data": msg.data, "status": msg.status, "retry_remaining": str(msg.retry_remaining),
            "effect_time": msg.effect_time.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3], "version": str(msg.version)}
    form.update(changes)
    return form


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match, "page has no CSRF token"
    return match.group(1)


class Browser:
    """A test client that signs in and sends the CSRF token it was given, like a real form."""

    def __init__(self, app, name=None):
        self.client = app.test_client()
        self.token = ""
        if name:
            page = self.client.get("/login").get_data(as_text=True)
            resp = self.client.post("/login", data={"csrf_token": csrf_of(page), "name": name, "password": PASSWORD})
            assert resp.status_code == 302, resp.get_data(as_text=True)
            self.refresh_token()

    def refresh_token(self):
        self.token = csrf_of(self.client.get("/messages").get_data(as_text=True))

    def get(self, path, **kw):
        return self.client.get(path, **kw)

    def post(self, path, data=None, csrf=True, **kw):
        data = dict(data or {})
        if csrf:
            data.setdefault("csrf_token", self.token)
        return self.client.post(path, data=data, **kw)


@pytest.fixture
def admin(app):
    return Browser(app, ADMIN)


@pytest.fixture
def viewer(app):
    return Browser(app, VIEWER)


def produce(storage, topic, datas, delay=0.0, retry=0, unique_keys=None):
    """Store messages straight through the storage layer; return their ids."""
    now = clock.now()
    storage.topics.ensure_topics([topic], now)
    rows = [NewRow(topic=topic, data=d, effect_time=clock.after(now, delay), retry_remaining=retry,
                   unique_key=(unique_keys[i] if unique_keys else None)) for i, d in enumerate(datas)]
    return storage.messages.insert_messages(rows, now, broker="test")


def fail_all(storage, topic, limit=1000):
    """Lease every due message of ``topic`` and report it failed (retry 0 -> FAIL)."""
    locked = storage.leases.lock_batch(LockRequest(Shard(topic), "test-consumer", 30, clock.now(), limit=limit,
                                                   broker="test-broker"))
    items = [AckItem(m.id, m.lease_token, False, "boom") for m in locked]
    storage.acks.ack(items, clock.now(), "test-consumer", "test-broker", TopicSettings)
    return [m.id for m in locked]


def lease_all(storage, topic, limit=1000, ttr=300):
    """Lease every due message of ``topic`` for ``ttr`` seconds."""
    return storage.leases.lock_batch(LockRequest(Shard(topic), "test-consumer", ttr, clock.now(), limit=limit,
                                                 broker="test-broker"))


def poison_all(storage, topic, limit=1000):
    """Make dead letters the way a consumer that dies on every delivery does: lease, let the
    lease run out, and expire it with max_deliveries 1 (FAIL by lease expiry)."""
    leased = lease_all(storage, topic, limit, ttr=1)
    moved = storage.leases.expire_leases(clock.after(clock.now(), 2), 100, "b", lambda topic: 1)
    assert moved == len(leased)
    return [m.id for m in leased]
