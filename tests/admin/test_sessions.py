"""Console sessions end for good (sign-out, password change, expiry), the sign-in brake is keyed
by (user, address) and shared through the database, and passwords follow the policy."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.admin.conftest import ADMIN, PASSWORD, VIEWER, Browser, csrf_of
from tidemq import clock
from tidemq.errors import ValidationError


def _copy(app, browser):
    """A second client holding a copy of ``browser``'s cookie, as a thief would."""
    thief = app.test_client()
    name = app.config["SESSION_COOKIE_NAME"]
    thief.set_cookie(name, browser.client.get_cookie(name).value)
    return thief


def _paused(storage, topic):
    return next(t.paused for t in storage.topics.list_topics() if t.name == topic)


def test_a_copied_cookie_stops_working_after_sign_out(app, storage):
    from tests.admin.conftest import produce

    produce(storage, "orders", ['{"a": 1}'])
    admin = Browser(app, ADMIN)
    thief = _copy(app, admin)
    assert thief.get("/topics").status_code == 200  # the copy works while the session lives
    assert admin.post("/logout").status_code == 302
    assert thief.get("/topics").status_code == 302
    # Nor can it change anything, even with the page's token in hand.
    resp = thief.post("/topics/orders/pause", data={"csrf_token": admin.token})
    assert resp.status_code in (302, 400)
    assert not _paused(storage, "orders")
    assert admin.get("/").status_code == 302


def test_sign_out_in_one_console_process_ends_the_session_in_another(app, settings):
    from tidemq_admin import create_app

    other = create_app(settings, secret_key=app.config["SECRET_KEY"])
    try:
        admin = Browser(app, ADMIN)
        copy = other.test_client()
        name = app.config["SESSION_COOKIE_NAME"]
        copy.set_cookie(name, admin.client.get_cookie(name).value)
        assert copy.get("/").status_code == 200  # same key, same database: the session is shared
        admin.post("/logout")
        assert copy.get("/").status_code == 302
    finally:
        other.extensions["tidemq"].storage.close()


def test_a_password_change_ends_every_session_of_that_user(app):
    from tidemq_admin.accounts import add_user

    first, second = Browser(app, VIEWER), Browser(app, VIEWER)
    bystander = Browser(app, ADMIN)
    add_user(app.extensions["tidemq"].storage.console, VIEWER, "a-new-long-passphrase", "viewer")
    assert first.get("/").status_code == 302
    assert second.get("/").status_code == 302
    assert bystander.get("/").status_code == 200  # other users keep theirs
    assert app.extensions["tidemq"].storage.sessions.count(VIEWER) == 0


def test_the_cookie_holds_a_random_id_only_its_hash_is_stored(app, mysql_db):
    import hashlib

    from flask.sessions import SecureCookieSessionInterface

    admin = Browser(app, ADMIN)
    raw = admin.client.get_cookie(app.config["SESSION_COOKIE_NAME"]).value
    data = SecureCookieSessionInterface().get_signing_serializer(app).loads(raw)
    assert set(data) == {"sid", "csrf"} and ADMIN not in raw
    stored = app.extensions["tidemq"].storage.sessions
    assert stored.count(ADMIN) == 1
    # The stored key is the SHA-256 of the id, never the id.
    from sqlalchemy import select

    from tidemq_broker.schema import admin_session

    keys = mysql_db.tx(lambda c: [r[0] for r in c.execute(select(admin_session.c.id_hash)).all()])
    assert hashlib.sha256(data["sid"].encode()).hexdigest() in keys
    assert data["sid"] not in keys


def test_idle_and_old_sessions_end(app):
    store = app.extensions["tidemq"].storage.sessions
    now = clock.now()
    idle, lifetime = timedelta(hours=2), timedelta(hours=12)
    sid = store.create(ADMIN, now)
    assert store.resolve(sid, now + timedelta(hours=1), idle, lifetime).name == ADMIN
    assert store.resolve(sid, now + timedelta(hours=2, minutes=59), idle, lifetime).name == ADMIN  # touched at 1 h
    assert store.resolve(sid, now + timedelta(hours=5), idle, lifetime) is None  # idle 2 h since
    assert store.resolve(sid, now + timedelta(hours=1), idle, lifetime) is None  # and the row is gone
    busy = store.create(ADMIN, now)
    for hours in range(1, 12):
        assert store.resolve(busy, now + timedelta(hours=hours), idle, lifetime) is not None
    assert store.resolve(busy, now + timedelta(hours=12, seconds=1), idle, lifetime) is None  # lifetime


def test_a_secure_console_marks_its_cookie_secure_and_host_only(settings):
    from tidemq_admin import create_app

    app = create_app(settings, secure_cookies=True)
    try:
        client = app.test_client()
        cookie = client.get("/login", base_url="https://localhost").headers["Set-Cookie"]
        assert cookie.startswith("__Host-tidemq_session=")
        assert "Secure" in cookie and "HttpOnly" in cookie and "Path=/" in cookie
        assert "Expires" not in cookie  # a browser-session cookie: the server-side record sets the lifetime
    finally:
        app.extensions["tidemq"].storage.close()


def test_failures_from_elsewhere_never_lock_the_user_out_of_its_own_address(app):
    attacker, owner = app.test_client(), app.test_client()
    token = csrf_of(attacker.get("/login").get_data(as_text=True))
    far = {"REMOTE_ADDR": "203.0.113.9"}
    codes = [attacker.post("/login", data={"csrf_token": token, "name": ADMIN, "password": f"guess-{i}"},
                           environ_base=far).status_code for i in range(5)]
    assert codes == [401, 401, 401, 429, 429]
    token = csrf_of(owner.get("/login").get_data(as_text=True))
    ok = owner.post("/login", data={"csrf_token": token, "name": ADMIN, "password": PASSWORD},
                    environ_base={"REMOTE_ADDR": "198.51.100.7"})
    assert ok.status_code == 302
    # The attacker's address is still braked, even with the right password.
    again = attacker.post("/login", data={"csrf_token": csrf_of(attacker.get("/login").get_data(as_text=True)),
                                          "name": ADMIN, "password": PASSWORD}, environ_base=far)
    assert again.status_code == 429


def test_guesses_sent_at_once_are_braked_like_guesses_sent_in_turn(app, monkeypatch):
    import threading

    _frozen_clock(monkeypatch)
    here = {"REMOTE_ADDR": "203.0.113.77"}
    clients = [app.test_client() for _ in range(12)]
    tokens = [csrf_of(c.get("/login").get_data(as_text=True)) for c in clients]
    codes, start = [], threading.Barrier(len(clients))

    def guess(i):
        start.wait()
        resp = clients[i].post("/login", data={"csrf_token": tokens[i], "name": VIEWER, "password": f"par-{i}"},
                               environ_base=here)
        codes.append(resp.status_code)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Each guess is counted before its password is checked: only the 3 free ones get an answer.
    assert sorted(codes) == [401] * 3 + [429] * 9


def _frozen_clock(monkeypatch):
    """Every attempt of a burst at the same moment: the brake's second wait (1 s after the third
    failure) cannot run out while a slow machine works through the burst."""
    frozen = clock.now()
    monkeypatch.setattr(clock, "now", lambda: frozen)


def test_the_first_guesses_of_a_new_pair_sent_at_once_are_counted_exactly(app, monkeypatch):
    """A locking read of a row that does not exist yet locks nothing under READ COMMITTED: two
    first attempts of a (user, address) pair could each read no failures and both go ahead.
    50 bursts of 20 guesses at once, each from a new address, on MariaDB."""
    import threading

    throttle = app.extensions["tidemq"].throttle
    _frozen_clock(monkeypatch)
    answered = []
    for burst in range(50):
        address, waits, start = f"198.18.{burst}.1", [], threading.Barrier(20)

        def guess():
            start.wait()
            waits.append(throttle.reserve(VIEWER, address, clock.now()))

        threads = [threading.Thread(target=guess) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(waits) == 20
        answered.append(sum(1 for wait in waits if wait == 0))
    # Only the 3 free attempts of each burst may go on to the password check.
    assert answered == [3] * 50, answered


def test_the_brake_counts_on_sqlite_too(tmp_path):
    from tidemq_admin.security import LoginThrottle
    from tidemq_broker.storages import open_storage

    storage = open_storage(f"sqlite:///{tmp_path}/brake.sqlite3")
    storage.schema.create_schema()
    try:
        throttle, now = LoginThrottle(storage.sessions), clock.now()
        assert [throttle.reserve("ops", "192.0.2.1", now) for _ in range(5)] == [0, 0, 0, 1.0, 1.0]
        throttle.succeeded("ops", "192.0.2.1")
        assert throttle.reserve("ops", "192.0.2.1", now) == 0
    finally:
        storage.close()


def test_a_right_password_takes_back_its_own_attempt_from_the_address(app):
    client = app.test_client()
    here = {"REMOTE_ADDR": "198.51.100.99"}
    for _ in range(12):  # more sign-ins than the address's 10 free failures: none is braked
        token = csrf_of(client.get("/login").get_data(as_text=True))
        assert client.post("/login", data={"csrf_token": token, "name": VIEWER, "password": PASSWORD},
                           environ_base=here).status_code == 302
        client.post("/logout", data={"csrf_token": csrf_of(client.get("/").get_data(as_text=True))})


def test_one_address_guessing_many_names_is_braked(app):
    client = app.test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))
    here = {"REMOTE_ADDR": "203.0.113.50"}
    codes = [client.post("/login", data={"csrf_token": token, "name": f"user{i}", "password": "x"},
                         environ_base=here).status_code for i in range(11)]
    assert codes[:10] == [401] * 10 and codes[10] == 429


def test_the_brake_is_shared_by_every_console_process(app, settings):
    from tidemq_admin import create_app

    other = create_app(settings)
    try:
        first, second = app.test_client(), other.test_client()
        here = {"REMOTE_ADDR": "192.0.2.77"}
        token = csrf_of(first.get("/login").get_data(as_text=True))
        for i in range(3):
            assert first.post("/login", data={"csrf_token": token, "name": VIEWER, "password": f"g{i}"},
                              environ_base=here).status_code == 401
        token2 = csrf_of(second.get("/login").get_data(as_text=True))
        resp = second.post("/login", data={"csrf_token": token2, "name": VIEWER, "password": PASSWORD},
                           environ_base=here)
        assert resp.status_code == 429
    finally:
        other.extensions["tidemq"].storage.close()


@pytest.mark.parametrize("password", ["password", "password1234", "Password123!", "qwerty123456", "123456789012",
                                      "aaaaaaaaaaaa", "abcabcabcabc", "monkeymonkey", "iloveyou2026!!",
                                      "short-pass", f"{ADMIN}-console-2026",
                                      # runs of letters, keyboard walks and dates, as the README says
                                      "abcdefghijklmn", "zyxwvutsrqponm", "acegikmoqsuw", "qwertyuiopasdf",
                                      "asdfghjkl;'zx", "mnbvcxzlkjhg", "2024-01-01-2024", "19840512198405",
                                      "s3cret-enough"])
def test_weak_passwords_are_refused_naming_the_rule(app, password):
    from tidemq_admin.accounts import add_user

    store = app.extensions["tidemq"].storage.console
    before = store.get_user(ADMIN).password_hash
    with pytest.raises(ValidationError) as exc:
        add_user(store, ADMIN, password, "admin")
    assert any(word in str(exc.value) for word in ("at least 12", "common password", "user name", "easy to guess"))
    assert store.get_user(ADMIN).password_hash == before  # nothing changed


def test_a_long_uncommon_password_is_accepted():
    from tidemq_admin.accounts import check_password

    check_password("correct-horse-9", "ops")
    check_password("tide is high, and moving", "ops")
    check_password("violet kettle orbit", "ops")
    check_password("Kx7#pQ2!vL9@", "ops")  # twelve characters of every kind, no pattern
