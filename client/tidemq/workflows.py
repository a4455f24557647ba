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

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Optional, Union

from .dependencies import FailurePolicy, WaitMode, check_wait_mode
from .errors import DependencyError
from .rpc import tidemq_pb2 as pb
from .rpc_build import Retry, dependency_ids, produce_messages, produce_template

__all__ = ["Workflow", "Step"]


@dataclass(frozen=True)
class Step:
    """A step of one :class:`Workflow`: what another step of it may come ``after``."""

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
        self._steps: list[tuple[pb.NewMessage, Any, Optional[str]]] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, topic: str, data: Any = None, *, after: Iterable[Step] = (), depends_on: Iterable[Any] = (),
            delay: Optional[float] = None, effect_time: Optional[datetime] = None, retry: Retry = None,
            priority: int = 0, key: Optional[str] = None, wait_mode: Optional[int] = None) -> Step:
        """Add a step: a message of ``topic`` that waits on the steps ``after`` (of this workflow)
        and on the stored messages ``depends_on`` (ids or handles), as ``wait_mode`` says (None:
        as the workflow's policy says). The other arguments are ``produce``'s; a step takes no
        ``unique_key``."""
        template = produce_template(topic, delay, effect_time, retry, priority)
        template.depends_on.extend(dependency_ids(depends_on))
        for step in after:
            if not isinstance(step, Step) or step.workflow is not self:
                raise DependencyError(f"after takes steps that this workflow's add returned, got {step!r}")
            template.after.append(step.position)
        if wait_mode is not None:
            try:
                mode = check_wait_mode(wait_mode)
            except ValueError as exc:
                raise DependencyError(str(exc)) from None
            if not (template.after or template.depends_on):
                raise DependencyError(f"wait_mode {mode.name.lower()} needs dependencies (after or depends_on)")
        else:
            mode = WaitMode.AFTER_COMPLETE if self.policy is FailurePolicy.CONTINUE else WaitMode.AFTER_SUCCESS
        if template.after or template.depends_on:
            template.wait_mode = int(mode)
        self._steps.append((template, data, key))
        return Step(self, len(self._steps) - 1)

    def messages(self, max_data_bytes: int) -> list[pb.NewMessage]:
        """The steps as the messages of one Produce request (their data encoded and checked
        against ``max_data_bytes``; an error names the step)."""
        built = []
        for position, (template, data, key) in enumerate(self._steps):
            try:
                [msg] = produce_messages(template, [data], None, max_data_bytes, [key] if key else None)
            except ValueError as exc:
                raise type(exc)(f"step {position}: {exc}") from None
            built.append(msg)
        return built
