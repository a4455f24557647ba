"""How a submission of steps with dependencies starts, shared by the SQL and the memory storage.

No SQL here: the checks every storage makes before it writes anything (limits, positions,
cycles), the order the steps are planned in, and each step's start once the statuses of the
stored messages it waits on are known (read under a row lock, so no SUCCESS slips between the
read and the insert). A storage then inserts every step as ``tidemq.dependencies.waiting``
says, sets the workflow id, stores the edges, stops what :func:`plan` says is stopped and
creates the workflow's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from tidemq.dependencies import WaitMode
from tidemq.errors import (DependencyCycleError, DependencyError, UnknownDependencyError, WorkflowTooLargeError,
                           quote)
from tidemq.lifecycle import CANCELLED, FAIL, NEW, RUNNING, SUCCESS, WAITING
from tidemq.limits import MAX_DEPENDENCIES
from tidemq.validation import check_workflow_steps

from ..records import WorkflowStep

__all__ = ["StepStart", "check_steps", "parent_ids", "check_known", "plan", "edges", "WAITED_ON"]

_FAILED = (FAIL.value, CANCELLED.value)
_MODES = frozenset(mode.value for mode in WaitMode)
#: The statuses of a stored dependency that has yet to finish: an edge to it is stored, and it
#: gets the workflow id so that its ack looks for the steps waiting on it.
WAITED_ON = tuple(status.value for status in (NEW, WAITING, RUNNING))


@dataclass(frozen=True)
class StepStart:
    """How one step starts: ``deps_left`` dependencies to wait for (``deps_failed`` of the others
    already ended FAIL or CANCELLED), or stopped (CANCELLED) by a stored dependency (``by_id``)
    or an earlier step (``by_step``) that ended ``by_status``: a failure for a step waiting after
    success, the last success for one waiting after failure (``not_needed``). A stopped step is
    inserted WAITING (``deps_left`` above 0) and cancelled in the same transaction."""

    deps_left: int
    by_id: Optional[int] = None
    by_step: Optional[int] = None
    by_status: str = ""
    deps_failed: int = 0
    not_needed: bool = False

    @property
    def stopped(self) -> bool:
        """Whether the step is stored CANCELLED: a dependency of it already failed."""
        return self.by_id is not None or self.by_step is not None


def check_steps(steps: Sequence[WorkflowStep]) -> list[int]:
    """Refuse a submission no storage may write (naming the limit, the position or the cycle);
    return the positions of ``steps`` in an order where each comes after the steps it waits on."""
    if not steps:
        return []
    check_workflow_steps(len(steps))
    for i, step in enumerate(steps):
        count = len(set(step.depends_on)) if step.depends_on else 0
        if count > MAX_DEPENDENCIES:
            raise WorkflowTooLargeError(f"step {i} waits on {count:,} stored messages, more than MAX_DEPENDENCIES "
                                        f"({MAX_DEPENDENCIES:,}): wait on a group of them through one step, or "
                                        "submit them in the same workflow")
        if step.wait_mode not in _MODES:
            raise DependencyError(f"step {i} has wait_mode {step.wait_mode}; the modes are "
                                  + ", ".join(f"{mode.value} ({mode.name.lower()})" for mode in WaitMode))
        if step.row.unique_key:
            # A repeated key would answer with a stored message whose dependencies are not these.
            raise DependencyError(f"step {i} has a unique_key {quote(step.row.unique_key)}: "
                                  "a step with dependencies or in a workflow takes none")
        for j in step.after:
            if not 0 <= j < len(steps):
                raise DependencyError(f"step {i} waits on step {j}, but the submission has steps 0 to "
                                      f"{len(steps) - 1}")
            if j == i:
                raise DependencyCycleError(f"step {i} waits on itself")
    return _order(steps)


def _order(steps: Sequence[WorkflowStep]) -> list[int]:
    """Kahn's order of the steps along their ``after`` edges; a cycle is named, never stored
    (no step of a cycle could ever become due)."""
    waits = [len(set(step.after)) if step.after else 0 for step in steps]
    children: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        if step.after:  # most steps of a wide group wait on nothing of the submission
            for j in set(step.after):
                children.setdefault(j, []).append(i)
    order = [i for i, n in enumerate(waits) if n == 0]
    for i in order:  # grows while it is walked
        for child in children.get(i, ()):
            waits[child] -= 1
            if waits[child] == 0:
                order.append(child)
    if len(order) < len(steps):
        cycle = _cycle(steps, set(order))
        raise DependencyCycleError(f"steps wait on each other in a cycle (each on the next): {cycle}")
    return order


def _cycle(steps: Sequence[WorkflowStep], ordered: set[int]) -> str:
    """One cycle among the steps ``ordered`` does not hold, as ``a -> b -> ... -> a``."""
    at = next(i for i in range(len(steps)) if i not in ordered)
    path: list[int] = []
    while at not in path:
        path.append(at)
        # Every step left over waits on at least one other step left over.
        at = next(j for j in steps[at].after if j not in ordered)
    loop = path[path.index(at):] + [at]
    shown = loop if len(loop) <= 12 else loop[:6] + ["..."] + loop[-6:]  # type: ignore[list-item]
    return " -> ".join(f"step {i}" if isinstance(i, int) else i for i in shown)


def parent_ids(steps: Sequence[WorkflowStep]) -> list[int]:
    """The stored messages the steps wait on, ascending (the order their rows are locked in)."""
    return sorted({id for step in steps for id in step.depends_on})


def check_known(wanted: Sequence[int], found: Mapping[int, str]) -> None:
    """Refuse dependencies on ids not stored (never produced, cancelled, removed by retention)."""
    unknown = [id for id in wanted if id not in found]
    if unknown:
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        shown = ", ".join(str(id) for id in unknown[:10]) + more
        raise UnknownDependencyError(f"no stored message has the id {shown}: a dependency must name a message "
                                     "that is stored (produced and not yet removed)")


def plan(steps: Sequence[WorkflowStep], order: Sequence[int], statuses: Mapping[int, str]) -> list[StepStart]:
    """Each step's start, by position. A stored dependency already SUCCESS is met; one already
    FAIL or CANCELLED, or an earlier step stopped, stops a step waiting after success (and so the
    steps after it in turn) and counts as ended, failed, for the others. A step waiting after
    failure whose dependencies all already succeeded is stopped as not needed. ``statuses``:
    every stored dependency's status."""
    starts: list[Optional[StepStart]] = [None] * len(steps)
    free = StepStart(0)  # a step that waits on nothing: most of a group's
    for i in order:
        step = steps[i]
        if not step.after and not step.depends_on:
            starts[i] = free
            continue
        stored, after = sorted(set(step.depends_on)), sorted(set(step.after))
        failed_ids = [id for id in stored if statuses[id] in _FAILED]
        failed_steps = [j for j in after if starts[j].stopped]  # type: ignore[union-attr]
        failed = len(failed_ids) + len(failed_steps)
        pending = sum(1 for id in stored if statuses[id] in WAITED_ON) + len(after) - len(failed_steps)
        if step.wait_mode == WaitMode.AFTER_SUCCESS and failed:
            # Inserted WAITING with every dependency not succeeded, then cancelled.
            deps_left = pending + failed
            if failed_ids:
                starts[i] = StepStart(deps_left, by_id=failed_ids[0], by_status=statuses[failed_ids[0]])
            else:
                starts[i] = StepStart(deps_left, by_step=failed_steps[0], by_status=CANCELLED.value)
        elif step.wait_mode == WaitMode.AFTER_FAILURE and stored and not after and not pending and not failed:
            starts[i] = StepStart(1, by_id=stored[-1], by_status=SUCCESS.value, not_needed=True)
        else:
            starts[i] = StepStart(pending, deps_failed=failed)
    return [start for start in starts if start is not None]


def edges(steps: Sequence[WorkflowStep], ids: Sequence[int], statuses: Mapping[int, str]) -> list[tuple[int, int]]:
    """The (parent_id, child_id) rows to store once the steps have ``ids``: every edge between
    steps and every edge to a stored message, finished or not. One that already finished never
    releases or stops anything (an ack only lowers the count of a WAITING step, which did not
    count it), but its edge is how a lease names it among the step's dependencies, whose results
    the step's handler reads (``Delivery.depends_on``)."""
    found: set[tuple[int, int]] = set()
    for i, step in enumerate(steps):
        if step.after:
            found.update((ids[j], ids[i]) for j in step.after)
        if step.depends_on:
            found.update((id, ids[i]) for id in step.depends_on)
    return sorted(found)
