"""Workflows at scale, shared by the integration tests and the benchmark's workflow scenario: a
random DAG with a fixed seed, a chord of many members, and what handler logs say about the
order steps ran in.

A handler log holds one line per completed run, ``<id> <pid> <attempt> <start> <end>`` (epoch
seconds; the format of ``tests/faults/fault_records.py``), as worker processes append it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tidemq import chord, group, sig

__all__ = ["Run", "Order", "read_runs", "random_dag", "dag_shape", "submit_dag", "wide_chord", "check_order"]


@dataclass(frozen=True)
class Run:
    """One completed handler run."""

    pid: int
    attempt: int
    start: float
    end: float


def read_runs(*logs: Path) -> dict[int, list[Run]]:
    """Every completed run in the handler logs, by message id, in the order they were written."""
    runs: dict[int, list[Run]] = {}
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            if line.strip():
                msg_id, pid, attempt, start, end = line.split()
                runs.setdefault(int(msg_id), []).append(Run(int(pid), int(attempt), float(start), float(end)))
    return runs


def random_dag(nodes: int, seed: int = 30) -> list[list[int]]:
    """For each node, the earlier nodes it waits on: a random DAG with several roots (about one
    node in a hundred, at least two), some fan-ins of 10 to 30 dependencies, a few hubs many
    nodes wait on (fan-outs), and otherwise one to three dependencies among the recent nodes
    (so the graph has depth, not only width). The same ``seed`` gives the same graph."""
    rng = random.Random(seed)
    roots = max(2, nodes // 100)
    hubs = sorted(rng.sample(range(nodes), max(1, nodes // 200)))
    deps: list[list[int]] = [[] for _ in range(nodes)]
    for i in range(roots, nodes):
        width = rng.randint(10, 30) if rng.random() < 0.02 else rng.choice((1, 1, 1, 2, 2, 3))
        recent = range(max(0, i - 50), i)
        chosen = set(rng.sample(recent, min(width, len(recent))))
        earlier_hubs = [h for h in hubs if h < i]
        if earlier_hubs and rng.random() < 0.1:
            chosen.add(rng.choice(earlier_hubs))
        deps[i] = sorted(chosen)
    return deps


def dag_shape(deps: Sequence[Sequence[int]]) -> dict[str, int]:
    """Nodes, roots, edges, the widest fan-in and fan-out, and the longest path (in nodes)."""
    fan_out = [0] * len(deps)
    depth = [1] * len(deps)
    for i, parents in enumerate(deps):  # parents always come before their children
        for j in parents:
            fan_out[j] += 1
            depth[i] = max(depth[i], depth[j] + 1)
    return {"nodes": len(deps), "roots": sum(1 for d in deps if not d), "edges": sum(len(d) for d in deps),
            "max fan-in": max((len(d) for d in deps), default=0), "max fan-out": max(fan_out, default=0),
            "longest path": max(depth, default=0)}


def submit_dag(client: Any, topic: str, deps: Sequence[Sequence[int]]) -> list[int]:
    """Submit the DAG as one workflow of ``topic`` (one transaction); the id of each node."""
    from tidemq import Workflow

    wf = Workflow()
    steps = []
    for i, parents in enumerate(deps):
        steps.append(wf.add(topic, {"node": i}, after=[steps[j] for j in parents]))
    return client.submit(wf)


def wide_chord(client: Any, topic: str, members: int, callback_topic: str) -> tuple[list[int], Any]:
    """A group of ``members`` steps of ``topic`` and a chord callback of ``callback_topic``, in one
    submission however wide (up to MAX_WORKFLOW_STEPS - 1 members: the callback waits on every
    one): ``(member ids, the callback's handle)``."""
    *ids, callback = chord(group(sig(topic, {"n": n}) for n in range(members)),
                           sig(callback_topic, {"callback": True})).produce(client, result=True)
    return [h.id for h in ids], callback


@dataclass(frozen=True)
class Order:
    """What the runs say about a workflow's order: steps that never ran, runs that started
    before one of their dependencies had ended (``(step, dependency)`` by id), and steps that
    ran more than once."""

    missing: list[int]
    early: list[tuple[int, int]]
    duplicates: dict[int, int]


def check_order(ids: Sequence[int], deps: Sequence[Sequence[int]], runs: dict[int, list[Run]]) -> Order:
    """Check the runs of the steps ``ids`` (node ``i`` has the id ``ids[i]`` and waits on the
    nodes ``deps[i]``): every run of a step must start after the first completed run of each of
    its dependencies ended (that run, or a later one, was acked before the step was released)."""
    missing = [ids[i] for i in range(len(ids)) if ids[i] not in runs]
    early = []
    for i, parents in enumerate(deps):
        for run in runs.get(ids[i], ()):
            for j in parents:
                ended = min((r.end for r in runs.get(ids[j], ())), default=float("inf"))
                if run.start < ended:
                    early.append((ids[i], ids[j]))
    duplicates = {msg_id: len(runs[msg_id]) for msg_id in ids if len(runs.get(msg_id, ())) > 1}
    return Order(missing, early, duplicates)
