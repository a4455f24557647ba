"""One wrapper around every handler run, built from layers: the work each run needs besides the
handler (its log context, its span, its metrics, its outcome), written once for both runners.

A layer is a function of the :class:`Run` returning a context manager, entered in order before
the handler and left in reverse after it, as middleware wraps a call (dramatiq's middleware,
River's worker middleware). The :func:`deciding` layer catches the handler's exception and
decides the run's outcome once (:func:`tidemq.lifecycle.handler_outcome`); layers outside it
read ``run.outcome`` on the way out, layers inside it see the exception itself. A QueueRunner
composes :func:`measured`, :func:`in_log_context`, :func:`deciding` and :func:`in_span`; a
BroadcastRunner the same without metrics (a broadcast is not a stored message).

Layers are context managers rather than ``layer(run, call_next)`` functions so that one layer
serves a threaded ``def`` handler and an ``async def`` handler alike: :meth:`HandlerWrapper.run_async`
enters the same layers inside the handler's task, where the context variables they set (the
log context, the current span) belong to that task alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, ContextManager, Iterator, Optional, Sequence

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
        with contextlib.ExitStack() as stack:
            for layer in self._layers:
                stack.enter_context(layer(run))
            call()
            run.outcome = HandlerOutcome.SUCCESS
        assert run.outcome is not None
        return run.outcome

    async def run_async(self, run: Run, call: Callable[[], Awaitable[Any]]) -> HandlerOutcome:
        """:meth:`run` for an ``async def`` handler, awaited in the calling task."""
        with contextlib.ExitStack() as stack:
            for layer in self._layers:
                stack.enter_context(layer(run))
            await call()
            run.outcome = HandlerOutcome.SUCCESS
        assert run.outcome is not None
        return run.outcome


@contextlib.contextmanager
def measured(run: Run) -> Iterator[None]:
    """The worker's metrics: how late the run starts, how long it takes, what came of it."""
    started = metrics.handler_started(run.topic, run.effect_time)
    yield
    if run.outcome is not None:
        metrics.handler_finished(run.topic, started, run.outcome)


def in_log_context(run: Run) -> ContextManager[None]:
    """Every line logged during the run names the message, its topic and its trace."""
    return message_context(run.id, run.topic, run.trace_context)


def in_span(run: Run) -> ContextManager[Any]:
    """The run's ``process <topic>`` span, a child of the producer's; it records an exception."""
    return tracing.handler_span(run.topic, run.id, run.attempt, run.trace_context)


def deciding(report_failure: Callable[[Run], None]) -> Layer:
    """A layer that takes the handler's exception as the run's outcome (the handler's failure is
    the message's, not the runner's) and calls ``report_failure(run)`` (the runner logs it)."""

    @contextlib.contextmanager
    def decide(run: Run) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            run.error, run.outcome = exc, handler_outcome(True, run.retry_remaining)
            report_failure(run)

    return decide
