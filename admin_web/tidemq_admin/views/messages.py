"""Message list (every topic or one, filtered, keyset-paginated) and message detail."""

from __future__ import annotations

import time

from flask import Blueprint, abort, render_template, request

from tidemq import trace

from ..forms import MAX_ID, filter_args, parse_filter, whole_number
from . import console

__all__ = ["bp", "PAGE_SIZE"]

bp = Blueprint("messages", __name__)
PAGE_SIZE = 50


@bp.route("/messages")
def index():  # type: ignore[no-untyped-def]
    c = console()
    parsed = parse_filter(request.args)
    before = request.args.get("before", "")
    before_id = whole_number(before, MAX_ID + 1, 1)  # a page ends below an id; anything else: the first page
    page = None
    elapsed_ms = None
    if not parsed.errors:
        started = time.perf_counter()
        page = c.storage.console.list_page(parsed.value, PAGE_SIZE, before_id)
        elapsed_ms = (time.perf_counter() - started) * 1000
    args = filter_args(request.args)
    topics = [t.name for t in c.storage.topics.list_topics()]
    return render_template("messages.html", page=page, errors=parsed.errors, args=args, topics=topics,
                           before_id=before_id, elapsed_ms=elapsed_ms, filtered=bool(args), flt=parsed.value)


@bp.route(f"/messages/<int(max={MAX_ID}):id>")
def detail(id: int):  # type: ignore[no-untyped-def]
    msg = console().storage.reads.get_message(id)
    if msg is None:
        abort(404, description=f"Message {id} does not exist (it may have been deleted or cleaned up by retention).")
    return render_template("message.html", msg=msg, trace=trace.parse(msg.trace))
