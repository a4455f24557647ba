"""A workflow: messages that wait on each other, submitted in one call and stored in one
transaction (``Client.submit``, ``AsyncClient.submit``, ``tidemq.submit``).

>>> wf = Workflow()
>>> parts = [wf.add("img.resize", {"n": n}) for n in range(3)]
>>> done = wf.add("img.zip", {"album": 7}, after=parts)
>>> ids = tidemq.submit(wf)          # one id per step, in the order they were added

A step waits (WAITING) until every step it comes ``after``, and every stored message it
``depends_on``, has succeeded, and becomes due in the transaction of the last SUCCESS. A cycle,
an unknown id or too many steps is refused by the broker and nothing is stored.

The failure policy says what a dependency that ends FAIL or CANCELLED does: ``stop`` (the
default) cancels the steps waiting on it, and theirs in turn; ``continue`` counts it as ended,
so a step runs once all its dependencies ended, whatever the outcome. A step may also name its
own ``wait_mode`` (``tidemq.dependencies.WaitMode``), as a batch's callbacks do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, NamedTuple, Optional, Union

from .dependencies import FailurePolicy, WaitMode, check_wait_mode
from .errors import DependencyError
from .rpc import tidemq_pb2 as pb
from .rpc_build import Retry, dependency_ids, produce_template
from .validation import check_flow_key, encode_data

__all__ = ["Workflow", "Step"]


class Step(NamedTuple):
    """A step of one :class:`Workflow`: what another step of it may come ``after``. A tuple: a
    group of 10,000 makes 10,000 of them, and each object the garbage collector tracks slows it."""

    workflow: "Workflow"
    position: int


class Workflow:
    """Steps and their order, built in memory and sent whole; nothing is stored before submit.
    ``policy``: ``"stop"`` or ``"continue"`` (see the module's docstring)."""

    def __init__(self, policy: Union[str, FailurePolicy] = FailurePolicy.STOP) -> None:
        try:
            self.policy = FailurePolicy(policy)
        except ValueError:
            known = ", ".join(repr(known.value) for known in FailurePolicy)
            raise DependencyError(f"a workflow's policy is one of {known}, got {policy!r}") from None
        # Per step: the template it shares with the steps of the same topic and options, its
        # data, flow key, stored dependencies, positions and wait mode (None: waits on nothing).
        self._steps: list[tuple[pb.NewMessage, Any, Optional[str], Any, Any, Optional[int]]] = []
        self._templates: dict[tuple[Any, ...], pb.NewMessage] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, topic: str, data: Any = None, *, after: Iterable[Step] = (), depends_on: Iterable[Any] = (),
            delay: Optional[float] = None, effect_time: Optional[datetime] = None, retry: Retry = None,
            priority: int = 0, key: Optional[str] = None, wait_mode: Optional[int] = None) -> Step:
        """Add a step: a message of ``topic`` that waits on the steps ``after`` (of this workflow)
        and on the stored messages ``depends_on`` (ids or handles), as ``wait_mode`` says (None:
        as the workflow's policy says). The other arguments are ``produce``'s; a step takes no
        ``unique_key``."""
        template = self._template(topic, delay, effect_time, retry, priority)
        # A group's member waits on nothing: it shares the empty tuples (fewer objects to collect).
        stored: Any = dependency_ids(depends_on) if depends_on else ()
        positions: Any = []
        for step in after:
            if not isinstance(step, Step) or step.workflow is not self:
                raise DependencyError(f"after takes steps that this workflow's add returned, got {step!r}")
            positions.append(step.position)
        positions = positions or ()
        if wait_mode is not None:
            try:
                mode = check_wait_mode(wait_mode)
            except ValueError as exc:
                raise DependencyError(str(exc)) from None
            if not (positions or stored):
                raise DependencyError(f"wait_mode {mode.name.lower()} needs dependencies (after or depends_on)")
        else:
            mode = WaitMode.AFTER_COMPLETE if self.policy is FailurePolicy.CONTINUE else WaitMode.AFTER_SUCCESS
        self._steps.append((template, data, key, stored, positions, int(mode) if positions or stored else None))
        return Step(self, len(self._steps) - 1)

    def _template(self, topic: str, delay: Optional[float], effect_time: Optional[datetime], retry: Retry,
                  priority: int) -> pb.NewMessage:
        """``produce_template`` of these options, checked and built once per workflow: a group's
        steps share one (building one per step was most of a wide shape's cost)."""
        retries = retry if retry is None or isinstance(retry, (int, str)) else tuple(retry)
        cache_key = (topic, delay, effect_time, retries, priority)
        try:
            template = self._templates.get(cache_key)
        except TypeError:  # unhashable options: checked (and refused) by produce_template
            return produce_template(topic, delay, effect_time, retry, priority)
        if template is None:
            template = self._templates[cache_key] = produce_template(topic, delay, effect_time, retry, priority)
        return template

    def messages(self, max_data_bytes: int) -> list[pb.NewMessage]:
        """The steps as the messages of one Produce request (their data encoded and checked
        against ``max_data_bytes``; an error names the step)."""
        built = []
        for position, (template, data, key, stored, positions, mode) in enumerate(self._steps):
            msg = pb.NewMessage()
            msg.CopyFrom(template)
            try:
                msg.data = encode_data(data, max_data_bytes)
                if key:
                    msg.key = check_flow_key(key)
            except ValueError as exc:
                raise type(exc)(f"step {position}: {exc}") from None
            if stored:
                msg.depends_on.extend(stored)
            if positions:
                msg.after.extend(positions)
            if mode is not None:
                msg.wait_mode = mode
            built.append(msg)
        return built
