"""Sessions, CSRF tokens, roles and the brake on repeated failed logins."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from typing import Optional
from urllib.parse import urlparse

from flask import Flask, abort, g, redirect, request, session, url_for

__all__ = ["LoginThrottle", "install", "csrf_token", "local_path", "login_user", "logout_user"]

#: Endpoints reachable without a session.
PUBLIC = {"auth.login", "static"}
#: POST endpoints a viewer may use (everything else that changes state needs the admin role).
VIEWER_POSTS = {"auth.login", "auth.logout"}


class LoginThrottle:
    """Slows down guessing: after ``free`` failures for a name or an address, each further
    attempt must wait twice as long as the last (capped at ``cap`` seconds)."""

    def __init__(self, free: int = 3, cap: float = 60.0) -> None:
        self.free = free
        self.cap = cap
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}

    def wait(self, *keys: str) -> float:
        """Seconds to wait before the next attempt for any of ``keys`` (0: go ahead)."""
        now = time.monotonic()
        with self._lock:
            waits = [self._delay(n) - (now - last) for n, last in (self._failures.get(k, (0, 0.0)) for k in keys)]
        return max([0.0, *waits])

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                n, _ = self._failures.get(key, (0, 0.0))
                self._failures[key] = (n + 1, now)

    def succeeded(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)

    def _delay(self, failures: int) -> float:
        if failures < self.free:
            return 0.0
        return min(2.0 ** (failures - self.free), self.cap)


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
    """Start a fresh session for ``name`` (a new session id and token: no fixation)."""
    session.clear()
    session["user"] = name
    session["csrf"] = secrets.token_urlsafe(32)


def logout_user() -> None:
    session.clear()


def install(app: Flask) -> None:
    """Gate every request: session required, CSRF token on every POST, admins only for changes."""

    @app.before_request
    def _gate() -> Optional[object]:
        console = app.extensions["tidemq"]
        g.user = None
        name = session.get("user")
        if name:
            g.user = console.admin.get_user(name)
            if g.user is None:  # deleted meanwhile
                session.clear()
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            sent = request.form.get("csrf_token", "") or request.headers.get("X-CSRF-Token", "")
            expected = session.get("csrf", "")
            if not expected or not hmac.compare_digest(sent, expected):
                abort(400, description="The form's security token is missing or out of date; reload the page and try again.")
        if request.endpoint in PUBLIC:
            return None
        if g.user is None:
            return redirect(url_for("auth.login", next=request.full_path.rstrip("?") if request.method == "GET" else None))
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
