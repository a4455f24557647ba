"""Message models and the Message a handler receives (the states live in ``tidemq.lifecycle``)."""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

from .control import RunControl
from .errors import InvalidMessageTypeError, MalformedRequestError, quote
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
    _touch: Optional[Callable[[float], bool]] = field(default=None, repr=False, compare=False)
    _control: Optional[RunControl] = field(default=None, repr=False, compare=False)

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
