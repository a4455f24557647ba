"""Message list (every topic or one, filtered, keyset-paginated), message detail (with its
result, error and progress), a message's result as JSON, and a topic's retained results."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from flask import Blueprint, abort, jsonify, render_template, request

from tidemq import trace
from tidemq.validation import check_topic
from tidemq.lifecycle import MessageStatus
from tidemq.results import parse_progress

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
    progress = parse_progress(msg.progress)
    error = _error(msg.status, msg.result)
    return render_template("message.html", msg=msg, trace=trace.parse(msg.trace), progress=progress, error=error,
                           result=msg.result if error is None else None)


@bp.route(f"/messages/<int(max={MAX_ID}):id>/result")
def result(id: int):  # type: ignore[no-untyped-def]
    """The message's status, result (or error) and progress as JSON: the console's API."""
    msg = console().storage.reads.get_message(id)
    if msg is None:
        abort(404, description=f"Message {id} does not exist (it may have been deleted or cleaned up by retention).")
    progress = parse_progress(msg.progress)
    error = _error(msg.status, msg.result)
    return jsonify(id=msg.id, topic=msg.topic, status=msg.status, cancel_requested=bool(msg.cancel_requested),
                   result=json.loads(msg.result) if msg.result is not None and error is None else None, error=error,
                   progress=None if progress is None else vars(progress))


@bp.route("/topics/<name>/results")
def retained(name: str):  # type: ignore[no-untyped-def]
    """The topic's finished messages that still hold a result or an error, newest first, paged."""
    try:
        topic = check_topic(name)
    except ValueError as exc:
        abort(400, description=str(exc))
    before_id = whole_number(request.args.get("before", ""), MAX_ID + 1, 1)
    page = console().storage.console.results_page(topic, PAGE_SIZE + 1, before_id)
    more = len(page) > PAGE_SIZE
    rows = [(state, _error(state.status, state.result)) for state in page[:PAGE_SIZE]]
    return render_template("results.html", topic=topic, rows=rows,
                           next_before=page[PAGE_SIZE - 1].id if more else None)


def _error(status: str, text: Optional[str]) -> Optional[dict[str, Any]]:
    """A stored failure ({"type", "message", "traceback"}) of a message not in SUCCESS."""
    if text is None or status == MessageStatus.SUCCESS.value:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        return {"type": "", "message": text, "traceback": ""}
    return fields if isinstance(fields, dict) else {"type": "", "message": text, "traceback": ""}
