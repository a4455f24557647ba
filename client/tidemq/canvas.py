"""Shapes of workflows: ``chain``, ``group`` and ``chord`` of message signatures (``sig``).

Each shape builds a :class:`~tidemq.workflows.Workflow` and submits it in one call, so the
whole shape is stored in one transaction, or not at all::

    chord(group(sig("img.resize", {"n": i}) for i in range(1000)), sig("img.zip")).produce()
    chain(sig("etl.fetch"), group(sig("etl.part", {"n": n}) for n in range(8)), sig("etl.merge")).produce()

A chain runs its items one after another (an item after every last step of the one before);
a group's items wait on nothing among themselves; a chord is a group and then its body.
"""

from __future__ import annotations

import abc
from typing import Any, Iterable, Optional, Union

from .workflows import Step, Workflow

__all__ = ["Signature", "Chain", "Group", "sig", "chain", "group", "chord"]


class _Shape(abc.ABC):
    """What every shape offers: the workflow it builds, and submitting it."""

    @abc.abstractmethod
    def add_to(self, workflow: Workflow, after: list[Step]) -> list[Step]:
        """Add this shape's steps to ``workflow``, its first ones after ``after``; return its last ones."""

    def workflow(self) -> Workflow:
        """A new workflow holding this shape's steps."""
        built = Workflow()
        self.add_to(built, [])
        return built

    def produce(self, client: Optional[Any] = None, timeout: Optional[float] = None, result: bool = False) -> list[Any]:
        """Submit this shape through ``client`` (the process-wide one by default): the ids of
        every step (or their handles with ``result``), in the order the shape lists them."""
        if client is None:
            from . import _default

            client = _default()
        return client.submit(self.workflow(), timeout=timeout, result=result)


class Signature(_Shape):
    """One message to produce: its topic, data, and ``produce``'s options (``delay``,
    ``effect_time``, ``retry``, ``priority``, ``key``, ``depends_on``)."""

    def __init__(self, topic: str, data: Any = None, **options: Any) -> None:
        self.topic, self.data, self.options = topic, data, options

    def add_to(self, workflow: Workflow, after: list[Step]) -> list[Step]:
        return [workflow.add(self.topic, self.data, after=after, **self.options)]


class Chain(_Shape):
    """Items that run one after another."""

    def __init__(self, items: Iterable[_Shape]) -> None:
        self.items = list(items)

    def add_to(self, workflow: Workflow, after: list[Step]) -> list[Step]:
        for item in self.items:
            after = item.add_to(workflow, after)
        return after


class Group(_Shape):
    """Items that run side by side; what comes after a group waits on all of them."""

    def __init__(self, items: Iterable[_Shape]) -> None:
        self.items = list(items)

    def add_to(self, workflow: Workflow, after: list[Step]) -> list[Step]:
        return [step for item in self.items for step in item.add_to(workflow, after)]


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


def chain(*items: ShapeArgs) -> Chain:
    """``items`` one after another."""
    return Chain(_items(items))


def group(*items: ShapeArgs) -> Group:
    """``items`` side by side."""
    return Group(_items(items))


def chord(header: ShapeArgs, body: _Shape) -> Chain:
    """``header`` (a group, or shapes to group) and then ``body``, which waits on all of it."""
    head = header if isinstance(header, _Shape) else group(header)
    return Chain([head, body])
