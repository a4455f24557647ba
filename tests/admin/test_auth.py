"""Sign-in, sessions, CSRF and the brake on guessing, through Flask's test client."""

from __future__ import annotations

import io
import sys

import pytest

from tests.admin.conftest import ADMIN, PASSWORD, VIEWER, Browser, csrf_of

PAGES = ["/", "/messages", "/messages?status=FAIL", "/messages/1", "/messages/1/edit", "/messages/new",
         "/topics", "/topics/orders/edit", "/cluster"]
POSTS = ["/logout", "/messages/1/edit", "/messages/1/retry", "/messages/1/cancel", "/messages/1/delete",
         "/messages/bulk", "/messages/requeue", "/messages/new", "/topics/orders/edit", "/topics/orders/pause",
         "/topics/orders/resume"]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_without_a_session_redirects_to_login(app, path):
    resp = app.test_client().get(path)
    assert resp.status_code == 302
    assert resp.location.startswith("/login")


def test_static_files_and_login_page_need_no_session(app):
    client = app.test_client()
    assert client.get("/login").status_code == 200
    assert client.get("/static/tidemq.css").status_code == 200


@pytest.mark.parametrize("path", [p for p in POSTS if p != "/logout"])
def test_post_without_a_session_is_refused_and_changes_nothing(app, storage, path):
    from tests.admin.conftest import produce

    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    path = path.replace("/1/", f"/{msg_id}/")
    client = app.test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))  # a token, but no signed-in user
    resp = client.post(path, data={"csrf_token": token, "ids": [str(msg_id)], "action": "delete"})
    assert resp.status_code == 302 and resp.location.startswith("/login")
    assert storage.reads.get_message(msg_id) is not None


@pytest.mark.parametrize("path", POSTS)
def test_post_without_csrf_token_is_refused(admin, storage, path):
    from tests.admin.conftest import produce

    [msg_id] = produce(storage, "orders", ['{"a": 1}'])
    path = path.replace("/1/", f"/{msg_id}/")
    resp = admin.post(path, data={"ids": [str(msg_id)], "action": "delete", "topic": "orders", "data": "{}",
                                  "status": "NEW", "retry_remaining": "0", "effect_time": "2030-01-01T00:00"},
                      csrf=False)
    assert resp.status_code == 400
    assert "security token" in resp.get_data(as_text=True)
    assert storage.reads.get_message(msg_id).data == '{"a": 1}'
    forged = admin.post(path, data={"ids": [str(msg_id)], "action": "delete", "csrf_token": "forged"}, csrf=False)
    assert forged.status_code == 400
    assert storage.reads.get_message(msg_id) is not None
    assert admin.get("/messages").status_code == 200  # still signed in: /logout did not run


def test_login_page_itself_needs_the_token(app):
    resp = app.test_client().post("/login", data={"name": ADMIN, "password": PASSWORD})
    assert resp.status_code == 400


def test_wrong_password_is_refused_and_right_one_signs_in(app):
    client = app.test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))
    bad = client.post("/login", data={"csrf_token": token, "name": ADMIN, "password": "nope-nope"})
    assert bad.status_code == 401
    assert "Wrong user name or password" in bad.get_data(as_text=True)
    ok = client.post("/login", data={"csrf_token": token, "name": ADMIN, "password": PASSWORD, "next": "/topics"})
    assert ok.status_code == 302 and ok.location == "/topics"


def test_next_never_leaves_the_site(app):
    client = app.test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))
    resp = client.post("/login", data={"csrf_token": token, "name": ADMIN, "password": PASSWORD,
                                       "next": "//evil.example/x"})
    assert resp.location == "/"


def test_repeated_failures_slow_down_further_attempts(app):
    client = app.test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))
    codes = [client.post("/login", data={"csrf_token": token, "name": VIEWER, "password": f"guess-{i}"}).status_code
             for i in range(4)]
    assert codes[:3] == [401, 401, 401]
    assert codes[3] == 429
    # Even the right password waits out the brake.
    resp = client.post("/login", data={"csrf_token": token, "name": VIEWER, "password": PASSWORD})
    assert resp.status_code == 429
    assert "Try again in" in resp.get_data(as_text=True)


def test_session_cookie_is_httponly_and_samesite(app):
    client = app.test_client()
    resp = client.get("/login")
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie


def test_logout_ends_the_session(admin):
    assert admin.get("/").status_code == 200
    resp = admin.post("/logout")
    assert resp.status_code == 302
    assert admin.get("/").status_code == 302


def test_security_headers_forbid_inline_script(admin):
    resp = admin.get("/")
    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_first_admin_comes_from_settings_and_keeps_its_password(app, settings):
    from tidemq_admin import create_app

    store = app.extensions["tidemq"].storage.console
    assert store.get_user(ADMIN).role == "admin"
    before = store.get_user(ADMIN).password_hash
    other = create_app(settings.__class__(**{**settings.__dict__, "admin_password": "another-password"}))
    assert other.extensions["tidemq"].storage.console.get_user(ADMIN).password_hash == before
    other.extensions["tidemq"].storage.close()


def test_cli_user_add_creates_a_viewer_that_cannot_change(app, settings, monkeypatch, capsys):
    from tidemq_cli.main import main

    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret-violet-kettle\n"))
    code = main(["--db-url", settings.db_url, "admin", "user", "add", "carol", "--role", "viewer", "--password-stdin"])
    assert code == 0
    assert "created with role viewer" in capsys.readouterr().out
    carol = app.extensions["tidemq"].storage.console.get_user("carol")
    assert carol.role == "viewer" and "s3cret" not in carol.password_hash
    client = app.test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))
    assert client.post("/login", data={"csrf_token": token, "name": "carol",
                                       "password": "s3cret-violet-kettle"}).status_code == 302


def test_cli_user_add_rejects_short_password_naming_the_limit(settings, monkeypatch, capsys):
    from tidemq_cli.main import main

    monkeypatch.setattr(sys, "stdin", io.StringIO("short\n"))
    code = main(["--db-url", settings.db_url, "admin", "user", "add", "dave", "--role", "admin", "--password-stdin"])
    assert code == 2
    assert "at least 12 characters" in capsys.readouterr().err


def test_redirect_targets_stay_on_this_site():
    from tidemq_admin.security import local_path

    for bad in ("/\t/evil.example/", "/\n/evil.example", "//evil.example", "/\\evil.example", "\\\\evil.example",
                "https://evil.example/", "evil.example", "/ /evil.example", ""):
        assert local_path(bad, "/home") == "/home", repr(bad)
    assert local_path("/messages?status=FAIL&topic=a.b", "/home") == "/messages?status=FAIL&topic=a.b"
