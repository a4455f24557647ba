"""Workflows: the list (newest first, by state, keyset-paginated) and one workflow's page, its
graph drawn as inline SVG (``dag.py``) above the table of its steps."""

from __future__ import annotations

from flask import Blueprint, abort, render_template, request, url_for
from markupsafe import Markup

from tidemq_broker.workflow_view import GRAPH_NODES, WORKFLOW_STATES

from ..dag import workflow_svg
from ..forms import MAX_ID, whole_number
from . import console

__all__ = ["bp", "PAGE_SIZE"]

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
    return render_template("workflow.html", graph=graph, wf=graph.summary, svg=svg, waits=waits, limit=GRAPH_NODES)
