"""Sessions, CSRF tokens, roles and the brake on repeated failed logins."""

from __future__ import annotations

import hmac
import secrets
from datetime import datetime, timedelta
from typing import Optional
from urllib.parse import urlparse

from flask import Flask, abort, current_app, g, redirect, request, session, url_for

from tidemq import clock
from tidemq_broker.storage import SessionStore

__all__ = ["LoginThrottle", "install", "csrf_token", "local_path", "login_user", "logout_user", "cookie_settings"]

#: Endpoints reachable without a session.
PUBLIC = {"auth.login", "static"}
#: POST endpoints a viewer may use (everything else that changes state needs the admin role).
VIEWER_POSTS = {"auth.login", "auth.logout"}


class LoginThrottle:
    """Slows down guessing, in the database so every console process shares one count.

    Failures are counted per (user, address) and per address. After ``free`` failures of a
    pair, each further attempt of that pair waits twice as long as the last (capped at ``cap``
    seconds); an address gets ``free_per_address`` failures over all names first. A user name is
    never a key on its own: failures from elsewhere never lock the real user out of its own
    address. Behind a reverse proxy run with ``--proxy`` so the address is the client's.
    """

    def __init__(self, store: SessionStore, free: int = 3, free_per_address: int = 10, cap: float = 60.0) -> None:
        self._store = store
        self.free = free
        self.free_per_address = free_per_address
        self.cap = cap

    @staticmethod
    def keys(name: str, address: str) -> tuple[str, str]:
        """The pair key and the address key of one attempt."""
        return f"pair:{name.strip().lower()}|{address}", f"addr:{address}"

    def reserve(self, name: str, address: str, now: datetime) -> float:
        """Seconds to wait before an attempt of ``name`` from ``address`` may be made (0: go
        ahead). Going ahead counts the attempt as a failure at once, before the password is
        checked, so parallel guesses are braked like sequential ones; :meth:`succeeded` takes it
        back."""
        pair, addr = self.keys(name, address)

        def wait_for(counts: dict[str, tuple[int, datetime]]) -> float:
            waits = [0.0]
            for key, free in ((pair, self.free), (addr, self.free_per_address)):
                if key in counts:
                    failures, last = counts[key]
                    waits.append(self._delay(failures, free) - (now - last).total_seconds())
            return max(waits)

        return self._store.reserve_attempt([pair, addr], now, wait_for)

    def succeeded(self, name: str, address: str) -> None:
        """The password was right: the pair's failures go; the address keeps the failures it had
        before this attempt (one right password must not wipe out a guesser's record)."""
        pair, addr = self.keys(name, address)
        self._store.attempt_succeeded(clear=[pair], undo=[addr])

    def _delay(self, failures: int, free: int) -> float:
        if failures < free:
            return 0.0
        return min(2.0 ** (failures - free), self.cap)


def local_path(target: str, default: str) -> str:
    r"""``target`` when it is a path on this site, else ``default``: never a redirect elsewhere.

    Browsers drop tabs and newlines from a URL and read a backslash as a slash, so "/\t/evil"
    and "/\\evil" would become "//evil", another site: any control character, whitespace or
    backslash refuses the target."""
    target = target or ""
    if (not target.startswith("/") or target.startswith("//") or "\\" in target
            or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in target)):
        return default
    parts = urlparse(target)
    return default if parts.scheme or parts.netloc else target


def csrf_token() -> str:
    """This session's CSRF token (created on first use)."""
    token = session.get("csrf")
    if not token:
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def login_user(name: str) -> None:
    """Start a fresh session for ``name``: a new server-side record and CSRF token (no fixation).

    The cookie carries only the record's random id; the record is what signs the browser in."""
    session.clear()
    session["sid"] = current_app.extensions["tidemq"].storage.sessions.create(name, clock.now())
    session["csrf"] = secrets.token_urlsafe(32)


def logout_user() -> None:
    """End this session's record, so a copy of the cookie signs nobody in afterwards."""
    sid = session.get("sid")
    if sid:
        current_app.extensions["tidemq"].storage.sessions.end(sid)
    session.clear()


def cookie_settings(secure: bool, idle: float, lifetime: float) -> dict[str, object]:
    """Flask settings for the session cookie.

    A secure console (HTTPS, directly or behind a proxy) marks the cookie ``Secure`` and names
    it with the ``__Host-`` prefix, which browsers only accept from HTTPS for this exact host and
    path. The cookie is a browser-session cookie; the server-side record decides how long it
    works (``idle`` and ``lifetime`` seconds)."""
    return {
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "SESSION_COOKIE_SECURE": secure,
        "SESSION_COOKIE_NAME": "__Host-tidemq_session" if secure else "tidemq_session",
        "SESSION_PERMANENT": False,
        "TIDEMQ_SESSION_IDLE": timedelta(seconds=idle),
        "TIDEMQ_SESSION_LIFETIME": timedelta(seconds=lifetime),
    }


def install(app: Flask) -> None:
    """Gate every request: session required, CSRF token on every POST, admins only for changes."""

    @app.before_request
    def _gate() -> Optional[object]:
        console = app.extensions["tidemq"]
        g.user = None
        if request.endpoint == "static":  # style sheets and scripts: no session, no database
            return None
        sid = session.get("sid")
        if sid:
            g.user = console.storage.sessions.resolve(sid, clock.now(), app.config["TIDEMQ_SESSION_IDLE"],
                                              app.config["TIDEMQ_SESSION_LIFETIME"])
            if g.user is None:  # signed out elsewhere, expired, password changed or user deleted
                session.clear()
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            sent = request.form.get("csrf_token", "") or request.headers.get("X-CSRF-Token", "")
            expected = session.get("csrf", "")
            if not expected or not hmac.compare_digest(sent, expected):
                abort(400, description="The form's security token is missing or out of date; reload the page "
                                       "and try again.")
        if request.endpoint in PUBLIC:
            return None
        if g.user is None:
            return redirect(url_for("auth.login",
                                    next=request.full_path.rstrip("?") if request.method == "GET" else None))
        if request.method not in ("GET", "HEAD", "OPTIONS") and request.endpoint not in VIEWER_POSTS \
                and g.user.role != "admin":
            abort(403, description="Your role is viewer: you can look but not change anything.")
        return None

    @app.after_request
    def _headers(response):  # type: ignore[no-untyped-def]
        # Even if some data slipped through unescaped, no inline or foreign script may run.
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if request.endpoint != "static":
            response.headers.setdefault("Cache-Control", "no-store")
        return response
