"""One wrapper around every handler run, built from layers: the work each run needs besides the
handler (its log context, its span, its metrics, its outcome), written once for both runners.

A layer is a function of the :class:`Run` returning a context manager, entered in order before
the handler and left in reverse after it, as middleware wraps a call (dramatiq's middleware,
River's worker middleware). The :func:`deciding` layer catches the handler's exception and
decides the run's outcome once (:func:`tidemq.lifecycle.handler_outcome`); layers outside it
read ``run.outcome`` on the way out, layers inside it see the exception itself. A QueueRunner
composes :class:`measured`, :func:`in_log_context`, :func:`deciding` and :func:`in_span`; a
BroadcastRunner the same without metrics (a broadcast is not a stored message).

Layers are context managers rather than ``layer(run, call_next)`` functions so that one layer
serves a threaded ``def`` handler and an ``async def`` handler alike: :meth:`HandlerWrapper.run_async`
enters the same layers inside the handler's task, where the context variables they set (the
log context, the current span) belong to that task alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, ContextManager, Optional, Sequence

from . import metrics, tracing
from .control import RunControl
from .lifecycle import HandlerOutcome, handler_outcome
from .link import AckItem, Delivery
from .logs import message_context
from .results import encode_result, error_result, max_result_bytes

__all__ = ["Run", "Layer", "HandlerWrapper", "measured", "in_log_context", "in_span", "deciding"]


@dataclass
class Run:
    """One handler run: the message it handles and, once it ended, how (``error``, ``outcome``,
    and ``result``, the handler's return value as JSON). ``control`` carries its cancel flag."""

    id: int
    topic: str
    attempt: int
    trace_context: str
    effect_time: datetime
    retry_remaining: int = 0
    error: Optional[BaseException] = None
    outcome: Optional[HandlerOutcome] = None
    result: Optional[str] = None
    control: Optional[RunControl] = None
    workflow_id: Optional[int] = None  # a workflow's step: its ack says so (``AckItem.workflow_id``)

    @classmethod
    def of(cls, delivery: Delivery) -> "Run":
        return cls(delivery.id, delivery.topic, delivery.attempt, delivery.trace_context, delivery.effect_time,
                   delivery.retry_remaining, workflow_id=delivery.workflow_id)

    @property
    def error_text(self) -> str:
        """The error as an ack reports it ("" after a success)."""
        return f"{type(self.error).__name__}: {self.error}" if self.error is not None else ""

    def ack(self, lease_token: str) -> AckItem:
        """The run's outcome as its ack: the result with a success, the error (as JSON) with a
        failure, ``cancelled`` when it stopped after a cancel request."""
        success = self.outcome is HandlerOutcome.SUCCESS
        result = self.result if success else error_result(self.error) if self.error is not None else None
        return AckItem(self.id, lease_token, success, self.error_text, result,
                       self.outcome is HandlerOutcome.CANCELLED, self.workflow_id is not None, self.workflow_id)


Layer = Callable[[Run], ContextManager[Any]]


class HandlerWrapper:
    """Runs handlers inside ``layers`` (outermost first) and returns each run's outcome.

    Without a :func:`deciding` layer a handler's exception is raised on. A cancelled async
    handler (``CancelledError``, not an Exception) always is: it has no outcome to report.
    """

    def __init__(self, layers: Sequence[Layer], results: bool = False) -> None:
        self._layers = tuple(layers)
        # Stored messages keep the return value (JSON, bounded); a broadcast has nowhere to.
        # The limit is read once here: reading the environment for each result was a tenth of
        # a small result's cost.
        limit = max_result_bytes() if results else 0
        self._encode: Callable[[Any], Optional[str]] = \
            (lambda value: encode_result(value, limit)) if results else _ignore

    def run(self, run: Run, call: Callable[[], Any]) -> HandlerOutcome:
        """Run ``call()`` (the handler, given its Message) inside the layers."""
        self._enter(0, run, call)
        assert run.outcome is not None
        return run.outcome

    def _enter(self, depth: int, run: Run, call: Callable[[], Any]) -> None:
        # Nested ``with`` statements, one per layer: a contextlib.ExitStack cost a run several
        # microseconds more, on the hot path of every message.
        if depth == len(self._layers):
            # Inside the layers: a return value that is not JSON fails the run like a raise.
            run.result = self._encode(call())
            run.outcome = HandlerOutcome.SUCCESS
            return
        with self._layers[depth](run):
            self._enter(depth + 1, run, call)

    async def run_async(self, run: Run, call: Callable[[], Awaitable[Any]]) -> HandlerOutcome:
        """:meth:`run` for an ``async def`` handler, awaited in the calling task."""
        await self._enter_async(0, run, call)
        assert run.outcome is not None
        return run.outcome

    async def _enter_async(self, depth: int, run: Run, call: Callable[[], Awaitable[Any]]) -> None:
        if depth == len(self._layers):
            run.result = self._encode(await call())
            run.outcome = HandlerOutcome.SUCCESS
            return
        with self._layers[depth](run):
            await self._enter_async(depth + 1, run, call)


def _ignore(value: Any) -> None:
    return None


class measured:
    """Layer: the worker's metrics, how late the run starts, how long it takes, what came of it."""

    __slots__ = ("_run", "_started")

    def __init__(self, run: Run) -> None:
        self._run = run
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = metrics.handler_started(self._run.topic, self._run.effect_time)

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], tb: Any) -> bool:
        if self._run.outcome is not None:  # none when the run was cancelled
            metrics.handler_finished(self._run.topic, self._started, self._run.outcome)
        return False


def in_log_context(run: Run) -> ContextManager[None]:
    """Layer: every line logged during the run names the message, its topic and its trace."""
    return message_context(run.id, run.topic, run.trace_context)


def in_span(run: Run) -> ContextManager[Any]:
    """Layer: the run's ``process <topic>`` span, a child of the producer's; it records an
    exception."""
    return tracing.handler_span(run.topic, run.id, run.attempt, run.trace_context)


def deciding(report_failure: Callable[[Run], None]) -> Layer:
    """A layer that takes the handler's exception as the run's outcome (the handler's failure is
    the message's, not the runner's) and calls ``report_failure(run)`` (the runner logs it)."""
    return lambda run: _Decide(run, report_failure)


class _Decide:
    __slots__ = ("_run", "_report")

    def __init__(self, run: Run, report: Callable[[Run], None]) -> None:
        self._run = run
        self._report = report

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], tb: Any) -> bool:
        if kind is None:
            return False  # a success
        run = self._run
        if run.control is not None and run.control.cancelled and issubclass(kind, (Exception, asyncio.CancelledError)):
            # It stopped because its cancel was requested (checkpoint() raised, its task was
            # cancelled, or it gave up its own way): the message ends CANCELLED.
            run.error, run.outcome = error, HandlerOutcome.CANCELLED
            return True
        if not issubclass(kind, Exception):
            return False  # a cancellation of the worker's own (a drain out of time): no outcome
        run.error, run.outcome = error, handler_outcome(True, run.retry_remaining)
        self._report(run)
        return True
