"""Schedules: periodic messages with their next tick; admins create, edit, pause and delete them."""

from __future__ import annotations

import logging
from typing import Optional

from flask import Blueprint, abort, flash, g, redirect, render_template, request, url_for

from tidemq import clock
from tidemq.errors import quote
from tidemq_broker.schedules import NAME_MAX_LENGTH, next_tick
from tidemq_broker.storage import Schedule

from ..forms import parse_schedule
from . import console

__all__ = ["bp"]

log = logging.getLogger(__name__)
bp = Blueprint("schedules", __name__)


@bp.route("/schedules")
def index():  # type: ignore[no-untyped-def]
    now = clock.now()
    rows = [(s, None if s.paused else next_tick(s, now)) for s in console().storage.schedules.list_schedules()]
    return render_template("schedules.html", rows=rows)


@bp.route("/schedules/new", methods=["GET", "POST"])
def create():  # type: ignore[no-untyped-def]
    return _form(None)


@bp.route("/schedules/<name>/edit", methods=["GET", "POST"])
def edit(name: str):  # type: ignore[no-untyped-def]
    return _form(_existing(name))


def _existing(name: str) -> Schedule:
    found = console().storage.schedules.get_schedule(name) if len(name) <= NAME_MAX_LENGTH else None
    if found is None:
        abort(404, description=f"There is no schedule named {quote(name)}.")
    return found


def _form(current: Optional[Schedule]):  # type: ignore[no-untyped-def]
    if request.method == "GET":
        return render_template("schedule_edit.html", schedule=current, form=None, errors={})
    parsed = parse_schedule(request.form, current.name if current else None)
    if parsed.errors:
        return render_template("schedule_edit.html", schedule=current, form=request.form, errors=parsed.errors), 400
    storage = console().storage
    if current is None and storage.schedules.get_schedule(parsed.value.name) is not None:
        errors = {"name": f"a schedule named {quote(parsed.value.name)} exists; edit it instead"}
        return render_template("schedule_edit.html", schedule=None, form=request.form, errors=errors), 400
    now = clock.now()
    storage.schedules.put_schedule(parsed.value, now)
    log.info("admin %s saved schedule %s", g.user.name, parsed.value.name)
    following = next_tick(parsed.value, now)
    flash(f"Schedule {parsed.value.name} saved; next tick "
          f"{following.isoformat(sep=' ', timespec='seconds') + ' UTC' if following else 'never'}.", "ok")
    return redirect(url_for("schedules.index"))


@bp.route("/schedules/<name>/pause", methods=["POST"])
def pause(name: str):  # type: ignore[no-untyped-def]
    return _set_paused(name, True)


@bp.route("/schedules/<name>/resume", methods=["POST"])
def resume(name: str):  # type: ignore[no-untyped-def]
    return _set_paused(name, False)


def _set_paused(name: str, paused: bool):  # type: ignore[no-untyped-def]
    _existing(name)
    console().storage.schedules.pause_schedule(name, paused, clock.now())
    log.info("admin %s %s schedule %s", g.user.name, "paused" if paused else "resumed", name)
    flash(f"Schedule {name} {'paused' if paused else 'resumed: ticks from now on, none caught up'}.", "ok")
    return redirect(url_for("schedules.index"))


@bp.route("/schedules/<name>/delete", methods=["POST"])
def delete(name: str):  # type: ignore[no-untyped-def]
    _existing(name)
    console().storage.schedules.delete_schedule(name)
    log.info("admin %s deleted schedule %s", g.user.name, name)
    flash(f"Schedule {name} deleted; messages it produced stay.", "ok")
    return redirect(url_for("schedules.index"))
