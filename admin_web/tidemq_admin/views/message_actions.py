"""Changing messages: edit, retry, cancel, delete (one or many), bulk requeue, test produce.

Each change appends a trace line naming the admin user, so the message tells who touched it.
Deletes leave no row to trace, so they are written to the log instead.
"""

from __future__ import annotations

import logging

from flask import Blueprint, abort, flash, g, redirect, render_template, request, url_for

from tidemq.validation import MAX_RETRIES
from tidemq_broker import clock, trace
from tidemq_broker.storage import MessageFilter, NewRow

from ..forms import EDIT_STATUSES, filter_args, parse_edit, parse_filter, parse_ids, parse_produce
from . import console

__all__ = ["bp"]

log = logging.getLogger(__name__)
bp = Blueprint("message_actions", __name__)
_BULK_CHUNK = 1000


def _retries(form_value: str) -> int:
    value = (form_value or "0").strip()
    if not value.isdigit() or int(value) > MAX_RETRIES:
        abort(400, description=f"retries must be a whole number between 0 and {MAX_RETRIES}")
    return int(value)


def _back(default: str) -> str:
    target = request.form.get("back", "")
    return target if target.startswith("/") and not target.startswith("//") else default


@bp.route("/messages/<int:id>/edit", methods=["GET", "POST"])
def edit(id: int):  # type: ignore[no-untyped-def]
    c = console()
    msg = c.storage.get_message(id)
    if msg is None:
        abort(404, description=f"Message {id} does not exist.")
    if request.method == "GET":
        return render_template("message_edit.html", msg=msg, form=None, errors={}, statuses=EDIT_STATUSES)
    parsed = parse_edit(request.form, c.settings.max_data_bytes)
    version = request.form.get("version", "")
    if parsed.errors or not version.isdigit():
        return render_template("message_edit.html", msg=msg, form=request.form, errors=parsed.errors,
                               statuses=EDIT_STATUSES), 400
    edit = parsed.value
    changed = [name for name, old in (("data", msg.data), ("status", msg.status),
                                      ("retry_remaining", msg.retry_remaining), ("effect_time", msg.effect_time))
               if getattr(edit, name) != old]
    if not changed:
        flash("Nothing changed.", "info")
        return redirect(url_for("messages.detail", id=id))
    now = clock.now()
    line = trace.line(now, "ADMIN_EDIT", user=g.user.name, changed=",".join(changed),
                      status=edit.status if "status" in changed else None)
    updated = c.admin.edit_message(id, int(version), edit, now, line)
    if updated is None:
        current = c.storage.get_message(id)
        if current is None:
            abort(404, description=f"Message {id} was deleted meanwhile.")
        why = ("it is RUNNING on a consumer; wait until it finishes or its lease expires"
               if current.status == "RUNNING" else "it changed while you were editing; review the new values")
        return render_template("message_edit.html", msg=current, form=request.form,
                               errors={"form": f"Not saved: {why}."}, statuses=EDIT_STATUSES), 409
    flash(f"Message {id} saved ({', '.join(changed)}).", "ok")
    return redirect(url_for("messages.detail", id=id))


@bp.route("/messages/<int:id>/retry", methods=["POST"])
def retry(id: int):  # type: ignore[no-untyped-def]
    c = console()
    retries = _retries(request.form.get("retries", "0"))
    now = clock.now()
    moved = c.storage.requeue([id], None, retries, now, trace.line(now, "ADMIN_RETRY", user=g.user.name, retries=retries))
    if moved:
        flash(f"Message {id} is NEW again and due now.", "ok")
    else:
        flash(f"Message {id} was not retried: only FAIL messages can be.", "error")
    return redirect(_back(url_for("messages.detail", id=id)))


@bp.route("/messages/<int:id>/cancel", methods=["POST"])
def cancel(id: int):  # type: ignore[no-untyped-def]
    if console().storage.cancel([id], clock.now())[0]:
        log.info("admin %s cancelled message %s", g.user.name, id)
        flash(f"Message {id} was pending and is now cancelled.", "ok")
        return redirect(url_for("messages.index"))
    flash(f"Message {id} was not cancelled: only NEW (pending) messages can be.", "error")
    return redirect(url_for("messages.detail", id=id))


@bp.route("/messages/<int:id>/delete", methods=["POST"])
def delete(id: int):  # type: ignore[no-untyped-def]
    if console().admin.delete_messages([id]):
        log.info("admin %s deleted message %s", g.user.name, id)
        flash(f"Message {id} deleted.", "ok")
        return redirect(_back(url_for("messages.index")))
    flash(f"Message {id} was not deleted: it is RUNNING on a consumer, or already gone.", "error")
    return redirect(url_for("messages.detail", id=id))


@bp.route("/messages/bulk", methods=["POST"])
def bulk():  # type: ignore[no-untyped-def]
    """Delete or requeue the checked messages."""
    c = console()
    ids = parse_ids(request.form.getlist("ids"))
    action = request.form.get("action")
    back = _back(url_for("messages.index"))
    if not ids:
        flash("Select messages first (the boxes on the left).", "error")
        return redirect(back)
    if action == "delete":
        n = c.admin.delete_messages(ids)
        log.info("admin %s deleted %d messages: %s", g.user.name, n, ids[:50])
        flash(f"Deleted {n} of {len(ids)} selected messages" + ("" if n == len(ids) else " (RUNNING ones are kept)") + ".", "ok")
    elif action == "requeue":
        retries = _retries(request.form.get("retries", "0"))
        now = clock.now()
        n = c.storage.requeue(ids, None, retries, now, trace.line(now, "ADMIN_RETRY", user=g.user.name, retries=retries))
        flash(f"Requeued {n} of {len(ids)} selected messages" + ("" if n == len(ids) else " (only FAIL ones move)") + ".", "ok")
    else:
        abort(400, description="action must be delete or requeue")
    return redirect(back)


@bp.route("/messages/requeue", methods=["POST"])
def requeue_matching():  # type: ignore[no-untyped-def]
    """Requeue every FAIL message matching the list's filter (every topic when none is set)."""
    c = console()
    parsed = parse_filter(request.form)
    if parsed.errors:
        abort(400, description="; ".join(f"{k}: {v}" for k, v in parsed.errors.items()))
    flt: MessageFilter = parsed.value
    if flt.status not in (None, "FAIL"):
        abort(400, description="only FAIL messages can be requeued: set the status filter to FAIL or leave it empty")
    flt.status = "FAIL"
    retries = _retries(request.form.get("retries", "0"))
    total, after = 0, 0
    while True:
        ids = c.admin.matching_ids(flt, after, _BULK_CHUNK)
        if not ids:
            break
        now = clock.now()
        total += c.storage.requeue(ids, None, retries, now,
                                   trace.line(now, "ADMIN_REQUEUE", user=g.user.name, retries=retries))
        after = ids[-1]
    flash(f"Requeued {total} failed message{'s' if total != 1 else ''}" +
          (f" of topic {flt.topic}" if flt.topic else " across all topics") + ".", "ok")
    args = filter_args(request.form)
    args.pop("status", None)
    return redirect(url_for("messages.index", **args))


@bp.route("/messages/new", methods=["GET", "POST"])
def produce():  # type: ignore[no-untyped-def]
    c = console()
    if request.method == "GET":
        return render_template("produce.html", form={"topic": request.args.get("topic", ""), "data": "{}",
                                                     "delay": "0", "retry": "0"}, errors={})
    parsed = parse_produce(request.form, c.settings.max_data_bytes)
    if parsed.errors:
        return render_template("produce.html", form=request.form, errors=parsed.errors), 400
    v = parsed.value
    now = clock.now()
    row = NewRow(topic=v["topic"], data=v["data"], effect_time=clock.after(now, v["delay"]),
                 retry_remaining=v["retry"], unique_key=v["unique_key"])
    c.storage.ensure_topics([v["topic"]], now)
    msg_id = c.storage.insert_messages([row], now, trace.line(now, "PRODUCED", user=g.user.name, via="console"))[0]
    flash(f"Produced message {msg_id} to {v['topic']}.", "ok")
    return redirect(url_for("messages.detail", id=msg_id))
