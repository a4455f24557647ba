"""The Flask app factory."""

from __future__ import annotations

import json
import logging
import secrets
from datetime import datetime
from typing import Any, Optional

from flask import Flask, render_template
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from tidemq import trace
from tidemq.config import Settings
from tidemq.coordinator import Coordinator
from tidemq.lifecycle import EDITABLE_STATUSES, STATUSES, Event, MessageStatus
from tidemq_broker.migrations import warn_if_behind
from tidemq_broker.storage import Storage
from tidemq_broker.storages import open_storage

from . import metrics, security
from .accounts import ensure_first_admin
from .console import Console

__all__ = ["create_app", "SESSION_IDLE", "SESSION_LIFETIME"]

log = logging.getLogger(__name__)


#: How long a console session lasts without a request, and at most (seconds).
SESSION_IDLE, SESSION_LIFETIME = 2 * 3600.0, 12 * 3600.0


def create_app(settings: Optional[Settings] = None, storage: Optional[Storage] = None,
               coordinator: Optional[Coordinator] = None, secret_key: Optional[str] = None, *,
               secure_cookies: bool = False, session_idle: float = SESSION_IDLE,
               session_lifetime: float = SESSION_LIFETIME) -> Flask:
    """Build the console for ``settings`` (default: from the environment).

    This is the console's composition root: it opens the storage once; the broker's operations,
    the console's own reads and its sessions are roles of that one storage. ``storage`` and
    ``coordinator`` may be shared with an embedded broker (``tidemq dev``); the console then
    works through the same database. Sessions are records in the database (signing out
    or a password change ends them everywhere); ``secret_key`` signs the cookie that names one
    (without it, cookies stop working when the process restarts). ``secure_cookies`` marks the
    cookie HTTPS-only: set it whenever browsers reach the console over HTTPS.
    """
    settings = settings or Settings.from_env()
    if storage is None:
        storage = open_storage(settings.db_url)
        storage.schema.create_schema()
        warn_if_behind(storage.schema, "console")
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or secrets.token_hex(32),
        MAX_CONTENT_LENGTH=settings.max_data_bytes * 6 + 65536,  # a form with escaped JSON data
    )
    app.config.update(security.cookie_settings(secure_cookies, session_idle, session_lifetime))
    console = Console(settings, storage, coordinator)
    app.extensions["tidemq"] = console
    ensure_first_admin(storage.console, settings)
    security.install(app)
    metrics.install(app)
    _install_template_helpers(app)

    from .views import auth, cluster, dashboard, message_actions, messages, schedules, topics, workflows

    for module in (auth, dashboard, messages, message_actions, workflows, topics, schedules, cluster):
        app.register_blueprint(module.bp)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):  # type: ignore[no-untyped-def]
        return render_template("error.html", code=exc.code, title=exc.name, detail=exc.description), exc.code

    return app


def _install_template_helpers(app: Flask) -> None:
    # Templates compare and list states through the lifecycle's enum, never spelled-out names.
    app.jinja_env.globals.update(csrf_token=security.csrf_token, Status=MessageStatus, STATUSES=STATUSES,
                                 EDITABLE_STATUSES=EDITABLE_STATUSES)

    @app.template_filter("last_error")
    def _last_error(text: str) -> str:
        """The error of a message's last FAIL trace line (why it is a dead letter), or ''."""
        for entry in reversed(trace.parse(text or "")):
            if entry["event"] == Event.FAIL.value:
                return entry.get("error", "")
        return ""

    @app.template_filter("when")
    def _when(value: Optional[datetime]) -> str:
        if value is None:
            return "—"
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"

    @app.template_filter("pretty_json")
    def _pretty(text: str) -> str:
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            return text

    @app.template_filter("age")
    def _age(seconds: Optional[float]) -> str:
        if seconds is None:
            return "—"
        seconds = max(seconds, 0)
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size:
                return f"{seconds / size:.1f} {unit}"
        return f"{seconds:.1f} s"

    @app.template_filter("svg")
    def _svg(markup: Any) -> Markup:
        # Charts are built from numbers and escaped labels by charts.py.
        return Markup(markup)
