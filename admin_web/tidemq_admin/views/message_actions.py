"""Changing messages: edit, retry, cancel, delete (one or many), bulk requeue, test produce.

Each change is a storage operation whose lifecycle transition appends a trace line naming the
admin user, so the message tells who touched it. Deletes leave no row to trace, so they are
written to the log instead. A change that makes messages due without a new id (a retry, an
edit, the steps a cancel, a delete or an edit releases) is signalled to the brokers, whose
insert watches would not see it.
"""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from typing import Iterable, Mapping

from flask import Blueprint, abort, flash, g, redirect, render_template, request, url_for

from tidemq import clock
from tidemq.lifecycle import Event, MessageStatus
from tidemq.validation import MAX_RETRIES
from tidemq_broker.storage import MessageEdit, MessageFilter, NewRow, StoredMessage

from ..forms import MAX_ID, filter_args, parse_edit, parse_filter, parse_ids, parse_produce, whole_number
from ..security import local_path
from . import console

__all__ = ["bp"]

log = logging.getLogger(__name__)
bp = Blueprint("message_actions", __name__)
_BULK_CHUNK = 1000
NEW, RUNNING, FAIL = MessageStatus.NEW.value, MessageStatus.RUNNING.value, MessageStatus.FAIL.value


def _retries(form_value: str) -> int:
    value = whole_number(form_value or "0", MAX_RETRIES)
    if value is None:
        abort(400, description=f"retries must be a whole number between 0 and {MAX_RETRIES}")
    return value


def _back(default: str) -> str:
    return local_path(request.form.get("back", ""), default)


def _due(released: Mapping[str, object], topics: Iterable[str] = ()) -> None:
    """Tell the brokers of what a change made due without a new id: steps it released
    (``released``, as the storage fills it) and messages of ``topics`` moved to NEW, due now."""
    console().cluster.signal_due(set(released) | set(topics))


def _only_changes(edit: MessageEdit, msg: StoredMessage) -> tuple[MessageEdit, list[str]]:
    """The edit with every field equal to the stored one left out (None), and the changed names.

    An unchanged status must not be set again: setting a status restarts finish_time."""
    changed = [f.name for f in fields(edit) if getattr(edit, f.name) != getattr(msg, f.name)]
    return replace(edit, **{f.name: None for f in fields(edit) if f.name not in changed}), changed


@bp.route(f"/messages/<int(max={MAX_ID}):id>/edit", methods=["GET", "POST"])
def edit(id: int):  # type: ignore[no-untyped-def]
    c = console()
    msg = c.storage.reads.get_message(id)
    if msg is None:
        abort(404, description=f"Message {id} does not exist.")
    if request.method == "GET":
        return render_template("message_edit.html", msg=msg, form=None, errors={})
    parsed = parse_edit(request.form, c.settings.max_data_bytes)
    version = whole_number(request.form.get("version", ""), 2**31 - 1)  # the version column's range
    if parsed.errors or version is None:
        return render_template("message_edit.html", msg=msg, form=request.form, errors=parsed.errors), 400
    edit, changed = _only_changes(parsed.value, msg)
    if not changed:
        flash("Nothing changed.", "info")
        return redirect(url_for("messages.detail", id=id))
    released: dict[str, dict[int, int]] = {}  # steps its new status releases
    try:
        updated = c.storage.messages.edit_message(id, version, edit, clock.now(), g.user.name, changed, released)
    except ValueError as exc:  # a status the message may not take (WAITING; a succeeded step's)
        return render_template("message_edit.html", msg=msg, form=request.form, errors={"status": str(exc)}), 400
    if updated is None:
        current = c.storage.reads.get_message(id)
        if current is None:
            abort(404, description=f"Message {id} was deleted meanwhile.")
        why = (f"it is {RUNNING} on a consumer; wait until it finishes or its lease expires"
               if current.status == RUNNING else "it changed while you were editing; review the new values")
        return render_template("message_edit.html", msg=current, form=request.form,
                               errors={"form": f"Not saved: {why}."}), 409
    # Left NEW: due now, or sooner than the pulls sleeping on its topic were told (or not: one look).
    _due(released, [updated.topic] if updated.status == NEW else ())
    flash(f"Message {id} saved ({', '.join(changed)}).", "ok")
    return redirect(url_for("messages.detail", id=id))


@bp.route(f"/messages/<int(max={MAX_ID}):id>/retry", methods=["POST"])
def retry(id: int):  # type: ignore[no-untyped-def]
    c = console()
    retries = _retries(request.form.get("retries", "0"))
    topics: set[str] = set()
    moved = c.storage.messages.requeue([id], None, retries, clock.now(), event=Event.ADMIN_RETRY, topics=topics,
                                       user=g.user.name)
    if moved:
        _due({}, topics)
        flash(f"Message {id} is {NEW} again and due now.", "ok")
    else:
        flash(f"Message {id} was not retried: only {FAIL} messages can be.", "error")
    return redirect(_back(url_for("messages.detail", id=id)))


@bp.route(f"/messages/<int(max={MAX_ID}):id>/cancel", methods=["POST"])
def cancel(id: int):  # type: ignore[no-untyped-def]
    """A pending message is deleted; a running one is marked, and its worker told, as
    ``cancel(id, running=True)`` does through a broker: its handler stops and it ends CANCELLED."""
    c = console()
    topics: set[str] = set()  # the running message's topic, when it was marked rather than deleted
    released: dict[str, dict[int, int]] = {}  # steps of other workflows that waited for it to end
    if not c.storage.messages.cancel([id], released, clock.now(), topics, user=g.user.name)[0]:
        flash(f"Message {id} was not cancelled: only {NEW} (pending) and {RUNNING} messages can be.", "error")
        return redirect(url_for("messages.detail", id=id))
    _due(released)
    if not topics:
        log.info("admin %s cancelled message %s", g.user.name, id)
        flash(f"Message {id} was pending and is now cancelled.", "ok")
        return redirect(url_for("messages.index"))
    log.info("admin %s requested the cancel of running message %s", g.user.name, id)
    told = ("now" if c.cluster.signal_cancels(topics)
            else "at its next heartbeat at the latest (ZooKeeper has not answered yet)")
    flash(f"Message {id} is running: its cancel is requested. Its worker learns of it {told}, stops its "
          "handler and ends it CANCELLED.", "ok")
    return redirect(url_for("messages.detail", id=id))


@bp.route(f"/messages/<int(max={MAX_ID}):id>/delete", methods=["POST"])
def delete(id: int):  # type: ignore[no-untyped-def]
    released: dict[str, dict[int, int]] = {}
    if console().storage.messages.delete_messages([id], released):
        _due(released)
        log.info("admin %s deleted message %s", g.user.name, id)
        flash(f"Message {id} deleted.", "ok")
        return redirect(_back(url_for("messages.index")))
    flash(f"Message {id} was not deleted: it is {RUNNING} on a consumer, or already gone.", "error")
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
        released: dict[str, dict[int, int]] = {}
        n = c.storage.messages.delete_messages(ids, released)
        _due(released)
        log.info("admin %s deleted %d messages: %s", g.user.name, n, ids[:50])
        kept = "" if n == len(ids) else f" ({RUNNING} ones are kept)"
        flash(f"Deleted {n} of {len(ids)} selected messages{kept}.", "ok")
    elif action == "requeue":
        retries = _retries(request.form.get("retries", "0"))
        topics: set[str] = set()
        n = c.storage.messages.requeue(ids, None, retries, clock.now(), event=Event.ADMIN_RETRY, topics=topics,
                                       user=g.user.name)
        _due({}, topics)
        kept = "" if n == len(ids) else f" (only {FAIL} ones move)"
        flash(f"Requeued {n} of {len(ids)} selected messages{kept}.", "ok")
    else:
        abort(400, description="action must be delete or requeue")
    return redirect(back)


@bp.route("/messages/requeue", methods=["POST"])
def requeue_matching():  # type: ignore[no-untyped-def]
    """Requeue every FAIL message matching the list's filter (every topic when none is set):
    dead letters of every kind, retries exhausted or poison messages failed by lease expiry."""
    c = console()
    parsed = parse_filter(request.form)
    if parsed.errors:
        abort(400, description="; ".join(f"{k}: {v}" for k, v in parsed.errors.items()))
    flt: MessageFilter = parsed.value
    if flt.status not in (None, FAIL):
        abort(400, description=f"only {FAIL} messages can be requeued: set the status filter to {FAIL} "
                               "or leave it empty")
    flt.status = FAIL
    retries = _retries(request.form.get("retries", "0"))
    total, after = 0, 0
    topics: set[str] = set()
    while True:
        ids = c.storage.console.matching_ids(flt, after, _BULK_CHUNK)
        if not ids:
            break
        total += c.storage.messages.requeue(ids, None, retries, clock.now(), event=Event.ADMIN_REQUEUE,
                                            topics=topics, user=g.user.name)
        after = ids[-1]
    _due({}, topics)
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
    c.storage.topics.ensure_topics([v["topic"]], now)
    msg_id = c.storage.messages.insert_messages([row], now, user=g.user.name, via="console")[0]
    flash(f"Produced message {msg_id} to {v['topic']}.", "ok")
    return redirect(url_for("messages.detail", id=msg_id))
