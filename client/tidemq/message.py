"""Message models and the Message a handler receives (the states live in ``tidemq.lifecycle``)."""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from .control import RunControl
from .errors import InputError, InvalidMessageTypeError, MalformedRequestError, quote
from .inputs import AsyncReadResults, Outcome, ReadResults, aread_outcomes, inputs_of, read_outcomes, single_input
from .lifecycle import MessageStatus

__all__ = ["MessageType", "MessageStatus", "Message"]


class MessageType(str, enum.Enum):
    """How a topic's messages are delivered.

    QUEUE: shared by the topic's consumers, each message to one of them (``MOD(id, total) = rank``).
    SERIAL_QUEUE: only the top-ranked consumer runs, one message at a time, in (effect_time, id) order.
    TOPIC: a broadcast, run once by every consumer online when it was sent.
    """

    QUEUE = "QUEUE"
    SERIAL_QUEUE = "SERIAL_QUEUE"
    TOPIC = "TOPIC"

    @classmethod
    def parse(cls, value: "MessageType | str") -> "MessageType":
        """Return the member for ``value`` or raise InvalidMessageTypeError naming the choices."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise InvalidMessageTypeError(
                f"unknown message type {quote(value)}: expected one of {choices}"
            ) from None


@dataclass
class Message:
    """A message as a handler receives it."""

    id: int
    topic: str
    data: Any
    effect_time: Optional[datetime] = None
    retry_remaining: int = 0
    attempt: int = 1
    lease_token: str = ""
    ttr: float = 0.0
    #: The W3C traceparent of the span that produced the message ("" when it had none): the
    #: handler's span is its child (``tidemq.tracing``).
    trace_context: str = ""
    #: The messages it waited on (produced with ``depends_on``, or a workflow's step), ascending
    #: ids: within one submission, the order the steps were declared in.
    depends_on: Sequence[int] = ()
    #: The workflow it is a step of (its first step's id, as ``tidemq.workflow_handle`` takes it);
    #: None when it belongs to none.
    workflow_id: Optional[int] = None
    _touch: Optional[Callable[[float], bool]] = field(default=None, repr=False, compare=False)
    _control: Optional[RunControl] = field(default=None, repr=False, compare=False)
    _results: Optional[ReadResults] = field(default=None, repr=False, compare=False)
    _aresults: Optional[AsyncReadResults] = field(default=None, repr=False, compare=False)
    _outcomes: Optional[list[Outcome]] = field(default=None, repr=False, compare=False)

    @property
    def outcomes(self) -> list[Outcome]:
        """How each dependency ended (:class:`~tidemq.inputs.Outcome`: id, status, result or
        error), in ``depends_on`` order; read from the brokers on first use, then kept."""
        if self._outcomes is None:
            if not self.depends_on:
                self._outcomes = []
            elif self._results is not None:
                self._outcomes = read_outcomes(self._results, list(self.depends_on))
            else:
                how = "await message.ainputs() (or ainput, aoutcomes)" if self._aresults is not None else \
                    "build it with tidemq.queue_runner.delivery_to_message"
                raise InputError(f"message {self.id} has dependencies but no link to read their results from "
                                 f"here: {how}")
        return self._outcomes

    @property
    def inputs(self) -> list[Any]:
        """The results of its dependencies, in ``depends_on`` order (a step after a group: the
        group's results). :class:`~tidemq.errors.InputError` if one did not succeed."""
        return inputs_of(self.id, self.outcomes)

    @property
    def input(self) -> Any:
        """The result of its one dependency (a chain's previous step). :class:`InputError` names
        the count when it has none or several."""
        if len(self.depends_on) != 1:
            return single_input(self.id, [Outcome(id, None) for id in self.depends_on])
        return single_input(self.id, self.outcomes)

    async def aoutcomes(self) -> list[Outcome]:
        """:attr:`outcomes` for ``async def`` handlers: the first read runs on a thread of the
        event loop's default executor, so other handlers go on meanwhile."""
        if self._outcomes is None and self.depends_on and self._aresults is not None:
            self._outcomes = await aread_outcomes(self._aresults, list(self.depends_on))
        elif self._outcomes is None:
            await asyncio.get_running_loop().run_in_executor(None, lambda: self.outcomes)
        return self.outcomes

    async def ainputs(self) -> list[Any]:
        """:attr:`inputs` for ``async def`` handlers (see :meth:`aoutcomes`)."""
        return inputs_of(self.id, await self.aoutcomes())

    async def ainput(self) -> Any:
        """:attr:`input` for ``async def`` handlers (see :meth:`aoutcomes`)."""
        if len(self.depends_on) != 1:
            return self.input
        return single_input(self.id, await self.aoutcomes())

    @property
    def cancelled(self) -> bool:
        """True once this message's cancel was requested (``cancel(id, running=True)``): the
        handler should stop; what it raises then ends the message CANCELLED."""
        return self._control is not None and self._control.cancelled

    def checkpoint(self) -> None:
        """Raise :class:`~tidemq.errors.MessageCancelledError` once this message's cancel was
        requested; call it between steps of long work."""
        if self._control is not None:
            self._control.checkpoint()

    def progress(self, done: float, total: Optional[float] = None, note: str = "") -> None:
        """Report progress (``done`` of ``total``, None: unknown; a short ``note``). The latest
        report reaches the broker with a heartbeat, at most about once a second, and shows on
        the message's handle and console page."""
        for value, what in ((done, "done"), (total, "total")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or value != value or value in (float("inf"), float("-inf"))):
                raise MalformedRequestError(f"progress {what} must be a finite number, got {quote(value)}")
        if self._control is not None:
            self._control.report(float(done), None if total is None else float(total), str(note))

    def touch(self, ttr: Optional[float] = None) -> bool:
        """Extend this message's lease by ``ttr`` seconds from now (default: the current ttr).

        Returns False when the lease was already lost (another consumer may run the message).
        Broadcast (TOPIC) messages have no lease and always return True.
        """
        if self._touch is None:
            return True
        return self._touch(ttr if ttr is not None else self.ttr)

    async def atouch(self, ttr: Optional[float] = None) -> bool:
        """:meth:`touch` for ``async def`` handlers: the call runs on a thread of the event
        loop's default executor, so other handlers go on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(None, self.touch, ttr)

    @classmethod
    def from_json(cls, id: int, topic: str, text: str, **kwargs: Any) -> "Message":
        """Build a Message whose data is decoded from JSON text."""
        return cls(id=id, topic=topic, data=json.loads(text), **kwargs)
