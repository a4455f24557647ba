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

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, ContextManager, Optional, Sequence

from . import metrics, tracing
from .lifecycle import HandlerOutcome, handler_outcome
from .link import Delivery
from .logs import message_context

__all__ = ["Run", "Layer", "HandlerWrapper", "measured", "in_log_context", "in_span", "deciding"]


@dataclass
class Run:
    """One handler run: the message it handles and, once it ended, how (``error``, ``outcome``)."""

    id: int
    topic: str
    attempt: int
    trace_context: str
    effect_time: datetime
    retry_remaining: int = 0
    error: Optional[Exception] = None
    outcome: Optional[HandlerOutcome] = None

    @classmethod
    def of(cls, delivery: Delivery) -> "Run":
        return cls(delivery.id, delivery.topic, delivery.attempt, delivery.trace_context, delivery.effect_time,
                   delivery.retry_remaining)

    @property
    def error_text(self) -> str:
        """The error as an ack reports it ("" after a success)."""
        return f"{type(self.error).__name__}: {self.error}" if self.error is not None else ""


Layer = Callable[[Run], ContextManager[Any]]


class HandlerWrapper:
    """Runs handlers inside ``layers`` (outermost first) and returns each run's outcome.

    Without a :func:`deciding` layer a handler's exception is raised on. A cancelled async
    handler (``CancelledError``, not an Exception) always is: it has no outcome to report.
    """

    def __init__(self, layers: Sequence[Layer]) -> None:
        self._layers = tuple(layers)

    def run(self, run: Run, call: Callable[[], Any]) -> HandlerOutcome:
        """Run ``call()`` (the handler, given its Message) inside the layers."""
        self._enter(0, run, call)
        assert run.outcome is not None
        return run.outcome

    def _enter(self, depth: int, run: Run, call: Callable[[], Any]) -> None:
        # Nested ``with`` statements, one per layer: a contextlib.ExitStack cost a run several
        # microseconds more, on the hot path of every message.
        if depth == len(self._layers):
            call()
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
            await call()
            run.outcome = HandlerOutcome.SUCCESS
            return
        with self._layers[depth](run):
            await self._enter_async(depth + 1, run, call)


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
        if kind is None or not issubclass(kind, Exception):
            return False  # a success, or a cancellation: not an outcome of the handler
        self._run.error, self._run.outcome = error, handler_outcome(True, self._run.retry_remaining)  # type: ignore[assignment]
        self._report(self._run)
        return True
