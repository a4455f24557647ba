"""Workflows: the list (newest first, by state, keyset-paginated), one workflow's page, its
graph drawn as inline SVG (``dag.py``) above the table of its steps, and its cancel."""

from __future__ import annotations

import logging

from flask import Blueprint, abort, flash, g, redirect, render_template, request, url_for
from markupsafe import Markup

from tidemq import clock
from tidemq.lifecycle import MessageStatus
from tidemq_broker.workflow_view import GRAPH_NODES, RUNNING, WORKFLOW_STATES, WorkflowGraph

from ..dag import workflow_svg
from ..forms import MAX_ID, whole_number
from . import console

__all__ = ["bp", "PAGE_SIZE"]

log = logging.getLogger(__name__)
bp = Blueprint("workflows", __name__)
PAGE_SIZE = 50


@bp.route("/workflows")
def index():  # type: ignore[no-untyped-def]
    state = request.args.get("state", "").strip().lower() or None
    if state is not None and state not in WORKFLOW_STATES:
        abort(400, description=f"Unknown workflow state {state[:40]!r}: use one of {', '.join(WORKFLOW_STATES)}.")
    before_id = whole_number(request.args.get("before", ""), MAX_ID + 1, 1)
    page = console().storage.console.workflow_page(state, PAGE_SIZE, before_id)
    return render_template("workflows.html", page=page, state=state, states=WORKFLOW_STATES, before_id=before_id)


#: A workflow's state on its page while the steps it has left are running ones marked cancelled.
CANCELLING = "cancelling"
_NEW, _WAITING, _RUNNING = (s.value for s in (MessageStatus.NEW, MessageStatus.WAITING, MessageStatus.RUNNING))


@bp.route(f"/workflows/<int(max={MAX_ID}):id>")
def detail(id: int):  # type: ignore[no-untyped-def]
    graph = console().storage.console.workflow_graph(id, GRAPH_NODES)
    if graph is None:
        abort(404, description=f"Workflow {id} does not exist: no stored message belongs to it (its steps may "
                               "have been deleted, archived or cleaned up by retention).")
    svg = Markup(workflow_svg(graph.nodes, graph.edges, lambda step: url_for("messages.detail", id=step)))
    waits: dict[int, list[int]] = {}
    for parent, child in graph.edges:
        waits.setdefault(child, []).append(parent)
    return render_template("workflow.html", graph=graph, wf=graph.summary, state=_state(graph), svg=svg, waits=waits,
                           limit=GRAPH_NODES, running=graph.summary.counts.get(_RUNNING, 0))


def _state(graph: WorkflowGraph) -> str:
    """The workflow's state, or CANCELLING while every step not ended is a RUNNING one marked
    cancelled (a cancel of the workflow, or of its messages, with ``running``): nothing is left
    to cancel, and a step that was not marked would still run its course."""
    counts = graph.summary.counts
    # Its steps' ids are at or above its own; below are messages stored before that it waited on.
    running = [node for node in graph.nodes if node.id >= graph.summary.id and node.status == _RUNNING]
    if (graph.summary.state == RUNNING and not counts.get(_NEW) and not counts.get(_WAITING)
            and len(running) == counts.get(_RUNNING) and all(node.cancel_requested for node in running)):
        return CANCELLING
    return graph.summary.state


@bp.route(f"/workflows/<int(max={MAX_ID}):id>/cancel", methods=["POST"])
def cancel(id: int):  # type: ignore[no-untyped-def]
    """Cancel the workflow whole, as ``cancel_workflow(id, running=True)`` does through a broker:
    its steps not run yet are removed, its running ones marked and their workers told, so their
    handlers stop and end CANCELLED; the workflow ends CANCELLED."""
    c = console()
    topics: set[str] = set()
    released: dict[str, dict[int, int]] = {}  # steps of other workflows that waited for its steps to end
    [done] = c.storage.dependencies.cancel_workflows([id], True, clock.now(), topics, released, user=g.user.name)
    c.cluster.signal_due(set(released))
    if not done.removed and not topics:
        flash(f"Workflow {id} was not cancelled: none of its steps is waiting, pending or running.", "error")
        return redirect(url_for("workflows.detail", id=id))
    log.info("admin %s cancelled workflow %s (%d steps removed, %d running ones marked)", g.user.name, id,
             done.removed, done.marked)
    said = f"Workflow {id} is cancelled: {_steps(done.removed)} removed"
    if topics:  # running steps: marked now, or by an earlier cancel (told again)
        when = ("now" if c.cluster.signal_cancels(topics)
                else "at their next heartbeat at the latest (ZooKeeper has not answered yet)")
        marked = f"{_steps(done.marked, 'running ')} marked" if done.marked else "its running steps marked before"
        said += (f", {marked} to stop. The workers of its running steps learn of it {when}, stop their handlers and "
                 "end them CANCELLED.")
    flash(said if topics else said + ".", "ok")
    return redirect(url_for("workflows.detail", id=id))


def _steps(count: int, kind: str = "") -> str:
    return f"{count} {kind}step{'' if count == 1 else 's'}"
