"""Topics: settings (editable by admins), pause and resume."""

from __future__ import annotations

import logging
from dataclasses import replace

from flask import Blueprint, flash, g, redirect, render_template, request, url_for

from tidemq import clock
from tidemq.errors import ValidationError
from tidemq.validation import check_topic
from tidemq_broker.storage import TopicSettings

from ..forms import MAX_DELIVERIES, parse_topic
from . import console

__all__ = ["bp"]

log = logging.getLogger(__name__)
bp = Blueprint("topics", __name__)


def _settings(name: str) -> TopicSettings:
    for s in console().storage.topics.list_topics():
        if s.name == name:
            return s
    return TopicSettings(name)


@bp.route("/topics")
def index():  # type: ignore[no-untyped-def]
    c = console()
    counted = c.storage.console.topic_counts()
    return render_template("topics.html", topics=c.storage.topics.list_topics(), counts=counted.counts, counted=counted)


@bp.route("/topics/<name>/edit", methods=["GET", "POST"])
def edit(name: str):  # type: ignore[no-untyped-def]
    try:
        check_topic(name)
    except ValidationError as exc:
        return render_template("error.html", code=400, title="Bad topic name", detail=str(exc)), 400
    current = _settings(name)
    if request.method == "GET":
        return render_template("topic_edit.html", topic=current, form=None, errors={}, max_deliveries=MAX_DELIVERIES)
    parsed = parse_topic(name, request.form)
    if parsed.errors:
        return render_template("topic_edit.html", topic=current, form=request.form, errors=parsed.errors,
                               max_deliveries=MAX_DELIVERIES), 400
    console().storage.topics.save_topic(parsed.value, clock.now())
    log.info("admin %s saved settings of topic %s", g.user.name, name)
    flash(f"Settings of {name} saved. Brokers apply them within a few seconds.", "ok")
    return redirect(url_for("topics.index"))


@bp.route("/topics/<name>/pause", methods=["POST"])
def pause(name: str):  # type: ignore[no-untyped-def]
    return _set_paused(name, True)


@bp.route("/topics/<name>/resume", methods=["POST"])
def resume(name: str):  # type: ignore[no-untyped-def]
    return _set_paused(name, False)


def _set_paused(name: str, paused: bool):  # type: ignore[no-untyped-def]
    try:
        check_topic(name)
    except ValidationError as exc:
        return render_template("error.html", code=400, title="Bad topic name", detail=str(exc)), 400
    console().storage.topics.save_topic(replace(_settings(name), paused=paused), clock.now())
    log.info("admin %s %s topic %s", g.user.name, "paused" if paused else "resumed", name)
    flash(f"Topic {name} {'paused: consumers get nothing until you resume it' if paused else 'resumed'}.", "ok")
    return redirect(url_for("topics.index"))
