"""Shapes of workflows: ``chain``, ``group``, ``chord`` and ``batch`` of message signatures (``sig``).

Each shape builds a :class:`~tidemq.workflows.Workflow` and submits it in one call, so the
whole shape is stored in one transaction, or not at all::

    chord(group(sig("img.resize", {"n": i}) for i in range(1000)), sig("img.zip")).produce()
    chain(sig("etl.fetch"), group(sig("etl.part", {"n": n}) for n in range(8)), sig("etl.merge")).produce()

A chain runs its items one after another (an item after every last step of the one before);
a group's items wait on nothing among themselves; a chord is a group and then its body. Each
takes ``policy=``: ``"stop"`` (a failure cancels what comes after it) or ``"continue"`` (what
comes after runs once everything before it ended, whatever the outcome). A batch is a group
with callbacks: ``on_complete`` after every member ended, ``on_success`` only if they all
succeeded, ``on_failure`` only if some did not (each is cancelled otherwise)::

    batch([sig("mail.send", {"to": t}) for t in people], on_complete=sig("mail.report"),
          on_failure=sig("mail.alert")).produce()
"""

from __future__ import annotations

import abc
import inspect
from typing import Any, Awaitable, Iterable, Optional, Union

from .dependencies import FailurePolicy, WaitMode
from .workflows import Step, Workflow

__all__ = ["Signature", "Chain", "Group", "Batch", "sig", "chain", "group", "chord", "batch"]

Policy = Union[str, FailurePolicy]


class _Shape(abc.ABC):
    """What every shape offers: the workflow it builds, and submitting it."""

    policy: Policy = FailurePolicy.STOP

    @abc.abstractmethod
    def add_to(self, workflow: Workflow, after: list[Step], wait_mode: Optional[int] = None) -> list[Step]:
        """Add this shape's steps to ``workflow``, its first ones after ``after`` (waiting as
        ``wait_mode`` says; None: as the workflow's policy says); return its last ones."""

    def workflow(self) -> Workflow:
        """A new workflow holding this shape's steps, under this shape's policy."""
        built = Workflow(self.policy)
        self.add_to(built, [])
        return built

    def produce(self, client: Optional[Any] = None, timeout: Optional[float] = None, result: bool = False,
                handle: bool = False) -> Any:
        """Submit this shape through ``client`` (the process-wide one by default): the ids of
        every step (or their handles with ``result``), in the order the shape lists them; with
        ``handle``, a handle on the workflow instead (``client.workflow_handle``: its state,
        waiting for its end, cancelling it). Through an AsyncClient, a coroutine of the same.
        A shape in which no step waits on another (a group alone) is stored as plain messages,
        not as a workflow: its workflow handle finds none."""
        if client is None:
            from . import _default

            client = _default()
        if result and handle:
            raise TypeError("produce returns the steps' handles (result) or the workflow's (handle), not both")
        submitted = client.submit(self.workflow(), timeout=timeout, result=result)
        if not handle:
            return submitted
        if inspect.isawaitable(submitted):
            return _handle_later(client, submitted)
        return client.workflow_handle(submitted)


async def _handle_later(client: Any, submitted: Awaitable[list[Any]]) -> Any:
    return client.workflow_handle(await submitted)


class Signature(_Shape):
    """One message to produce: its topic, data, and ``produce``'s options (``delay``,
    ``effect_time``, ``retry``, ``priority``, ``key``, ``depends_on``)."""

    def __init__(self, topic: str, data: Any = None, **options: Any) -> None:
        self.topic, self.data, self.options = topic, data, options

    def add_to(self, workflow: Workflow, after: list[Step], wait_mode: Optional[int] = None) -> list[Step]:
        waits = wait_mode if after or self.options.get("depends_on") else None
        return [workflow.add(self.topic, self.data, after=after, wait_mode=waits, **self.options)]


class Chain(_Shape):
    """Items that run one after another."""

    def __init__(self, items: Iterable[_Shape], policy: Policy = FailurePolicy.STOP) -> None:
        self.items, self.policy = list(items), policy

    def add_to(self, workflow: Workflow, after: list[Step], wait_mode: Optional[int] = None) -> list[Step]:
        for n, item in enumerate(self.items):
            after = item.add_to(workflow, after, wait_mode if n == 0 else None)
        return after


class Group(_Shape):
    """Items that run side by side; what comes after a group waits on all of them."""

    def __init__(self, items: Iterable[_Shape], policy: Policy = FailurePolicy.STOP) -> None:
        self.items, self.policy = list(items), policy

    def add_to(self, workflow: Workflow, after: list[Step], wait_mode: Optional[int] = None) -> list[Step]:
        return [step for item in self.items for step in item.add_to(workflow, after, wait_mode)]


class Batch(_Shape):
    """Members that run side by side, and callbacks after them: ``on_complete`` once every
    member ended, ``on_success`` only if they all succeeded, ``on_failure`` only if some did not
    (a callback whose condition is not met is cancelled). What comes after a batch waits on its
    members, as after a group."""

    def __init__(self, items: Iterable[_Shape], on_complete: Optional[_Shape] = None,
                 on_success: Optional[_Shape] = None, on_failure: Optional[_Shape] = None,
                 policy: Policy = FailurePolicy.STOP) -> None:
        self.items, self.policy = list(items), policy
        if not self.items:
            raise ValueError("a batch needs at least one item")
        self.callbacks = [(callback, mode) for callback, mode in (
            (on_complete, WaitMode.AFTER_COMPLETE), (on_success, WaitMode.AFTER_SUCCESS),
            (on_failure, WaitMode.AFTER_FAILURE)) if callback is not None]
        for callback, _ in self.callbacks:
            if not isinstance(callback, _Shape):
                raise TypeError(f"a batch's callback is sig(...), chain(...) or group(...), got {callback!r}")

    def add_to(self, workflow: Workflow, after: list[Step], wait_mode: Optional[int] = None) -> list[Step]:
        members = [step for item in self.items for step in item.add_to(workflow, after, wait_mode)]
        for callback, mode in self.callbacks:
            callback.add_to(workflow, members, mode)
        return members


ShapeArgs = Union[_Shape, Iterable[_Shape]]


def _items(items: tuple[ShapeArgs, ...]) -> list[_Shape]:
    # group(sig(...) for ...) passes one iterable; group(a, b) passes the shapes themselves.
    if len(items) == 1 and not isinstance(items[0], _Shape):
        items = tuple(items[0])
    for item in items:
        if not isinstance(item, _Shape):
            raise TypeError(f"a chain, group or chord holds sig(...), chain(...) or group(...), got {item!r}")
    return list(items)  # type: ignore[arg-type]


def sig(topic: str, data: Any = None, **options: Any) -> Signature:
    """One message of a shape (see :class:`Signature`)."""
    return Signature(topic, data, **options)


def chain(*items: ShapeArgs, policy: Policy = FailurePolicy.STOP) -> Chain:
    """``items`` one after another; ``policy``: ``"stop"`` or ``"continue"``."""
    return Chain(_items(items), policy)


def group(*items: ShapeArgs, policy: Policy = FailurePolicy.STOP) -> Group:
    """``items`` side by side; ``policy``: ``"stop"`` or ``"continue"``."""
    return Group(_items(items), policy)


def chord(header: ShapeArgs, body: _Shape, policy: Policy = FailurePolicy.STOP) -> Chain:
    """``header`` (a group, or shapes to group) and then ``body``, which waits on all of it
    (with ``policy="continue"``, runs once all of it ended, whatever the outcome). One submission
    however wide the header: a step may come after any number of the steps of its own submission
    (up to ``MAX_WORKFLOW_STEPS`` in all), so no join steps are needed."""
    head = header if isinstance(header, _Shape) else group(header)
    return Chain([head, body], policy)


def batch(items: ShapeArgs, *, on_complete: Optional[_Shape] = None, on_success: Optional[_Shape] = None,
          on_failure: Optional[_Shape] = None, policy: Policy = FailurePolicy.STOP) -> Batch:
    """``items`` (at least one) side by side, with optional callbacks (see :class:`Batch`)."""
    return Batch(_items((items,)), on_complete, on_success, on_failure, policy)
