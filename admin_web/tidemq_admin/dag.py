"""A workflow drawn on the server as inline SVG: no script, no layout library, readable offline.

The layout is layered: a step's column is the longest path to it from a step that waits on
nothing drawn (so every edge points right), and within a column the steps are ordered by the
mean row of what they wait on, then by id, which keeps a chain on one row and a fan-out's
members together. Each step is a rectangle coloured by its status with the classes the
console's status badges use (``n-<status>``), holding its id and topic, and a link to its
message page; each edge is a curve from the right side of the step waited on to the left side
of the step that waits.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

from markupsafe import escape

from tidemq_broker.workflow_view import WorkflowNode

__all__ = ["layers", "workflow_svg"]

_W, _H = 168, 42  # a step's box
_DX, _DY = 220, 58  # the distance between columns and between rows
_PAD = 16
_TOPIC_CHARS = 22


def layers(nodes: Sequence[WorkflowNode], edges: Sequence[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """{id: (column, row)} of ``nodes``: the column is the longest path from a root along
    ``edges`` (parent, child); rows count from 0 in each column."""
    ids = [node.id for node in nodes]
    known = set(ids)
    parents: dict[int, list[int]] = defaultdict(list)
    children: dict[int, list[int]] = defaultdict(list)
    waits = {id: 0 for id in ids}
    for parent, child in edges:
        if parent in known and child in known and parent != child:
            parents[child].append(parent)
            children[parent].append(child)
            waits[child] += 1
    column = {id: 0 for id in ids}
    ready = sorted(id for id in ids if waits[id] == 0)
    order: list[int] = []
    while ready:  # Kahn's order: a step comes after every step it waits on
        id = ready.pop(0)
        order.append(id)
        for child in children[id]:
            column[child] = max(column[child], column[id] + 1)
            waits[child] -= 1
            if waits[child] == 0:
                ready.append(child)
    # Stored edges have no cycle (a submission refuses one); anything left is drawn in column 0.
    placed = set(order)
    order += [id for id in ids if id not in placed]
    place: dict[int, tuple[int, int]] = {}
    by_column: dict[int, list[int]] = defaultdict(list)
    for id in order:
        by_column[column[id]].append(id)
    for col in sorted(by_column):
        def key(id: int) -> tuple[float, int]:
            rows = [place[p][1] for p in parents[id] if p in place]
            return (sum(rows) / len(rows) if rows else -1.0, id)

        for row, id in enumerate(sorted(by_column[col], key=key)):
            place[id] = (col, row)
    return place


def workflow_svg(nodes: Sequence[WorkflowNode], edges: Sequence[tuple[int, int]], link: Callable[[int], str]) -> str:
    """The SVG of a workflow's ``nodes`` and ``edges``; ``link(id)`` is a step's message page."""
    place = layers(nodes, edges)
    if not place:
        return ""
    columns = max(col for col, _ in place.values()) + 1
    rows = max(row for _, row in place.values()) + 1
    width = 2 * _PAD + (columns - 1) * _DX + _W
    height = 2 * _PAD + (rows - 1) * _DY + _H

    def corner(id: int) -> tuple[int, int]:
        col, row = place[id]
        return _PAD + col * _DX, _PAD + row * _DY

    parts = [f'<svg class="dag" id="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="workflow graph">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" class="arrowhead"/></marker></defs>']
    for parent, child in edges:
        if parent not in place or child not in place:
            continue
        (px, py), (cx, cy) = corner(parent), corner(child)
        x1, y1, x2, y2 = px + _W, py + _H // 2, cx, cy + _H // 2
        bend = max((x2 - x1) // 2, 24)
        parts.append(f'<path class="edge" data-edge="{parent}-{child}" marker-end="url(#arrow)" '
                     f'd="M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"/>')
    for node in nodes:
        x, y = corner(node.id)
        status = escape(node.status)
        topic = node.topic if len(node.topic) <= _TOPIC_CHARS else node.topic[: _TOPIC_CHARS - 1] + "…"
        parts.append(
            f'<a href="{escape(link(node.id))}" class="node n-{status.lower()}" id="node-{node.id}" '
            f'data-status="{status}"><title>{node.id} {escape(node.topic)}: {status}</title>'
            f'<rect x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6"/>'
            f'<text x="{x + 8}" y="{y + 17}" class="id">{node.id} · {status}</text>'
            f'<text x="{x + 8}" y="{y + 33}" class="topic">{escape(topic)}</text></a>')
    parts.append("</svg>")
    return "".join(parts)
