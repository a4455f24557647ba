"""``@mq_consumer``: declare a handler; ``tidemq worker`` (or a Worker) runs it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

from .errors import ConfigurationError, quote
from .limits import MAX_AHEAD, MAX_PULL, MAX_TTR, MIN_TTR
from .message import Message, MessageType
from .validation import check_topic

__all__ = ["ConsumerSpec", "mq_consumer", "registered_consumers", "clear_registry", "DEFAULT_AHEAD", "MAX_AHEAD",
           "DEFAULT_CONCURRENCY", "MAX_CONCURRENCY"]

Handler = Callable[[Message], Union[None, Awaitable[None]]]
#: Async handlers running at once per consumer when neither the decorator nor ``tidemq worker
#: --concurrency`` says: tasks are cheap, but each holds a leased message.
DEFAULT_CONCURRENCY = 16
MAX_CONCURRENCY = 10_000
#: Seconds before due that a delayed message is leased to a waiting worker by default: enough for
#: a lock and a round trip, small beside any ttr, so a worker that dies holding some loses little.
DEFAULT_AHEAD = 1.0
_REGISTRY: list["ConsumerSpec"] = []


@dataclass(frozen=True)
class ConsumerSpec:
    """A declared consumer.

    threads: handlers running at once. ttr: the lease length. While its worker lives, a message's
    lease is extended every ttr/3 (heartbeats), however long the handler runs; when the worker
    dies, its messages are delivered again about ttr seconds later. batch: messages pulled per
    call; at most ``threads + batch`` are leased and not yet acknowledged at any time. None (the
    default) adapts it to the handler: about half a second of work per pull, from 1 to 500
    messages (:mod:`tidemq.prefetch`). ahead: how
    many seconds before its effect_time a delayed message may be leased to this worker, which
    then starts it on time by its own clock (0: lease only what is due). concurrency: for an
    ``async def`` handler, the handlers running at once on the worker's event loop (None: the
    worker's ``--concurrency``, else DEFAULT_CONCURRENCY); async handlers use it instead of threads.
    schedule: a cron
    expression (``tidemq.schedule``'s form) in ``schedule_timezone``; the worker declares it, named
    after the topic, when it starts, so the topic gets one message per tick.
    """

    topic: str
    type: MessageType
    handler: Handler
    threads: int = 1
    ttr: float = 60.0
    batch: Optional[int] = None
    ahead: float = DEFAULT_AHEAD
    concurrency: Optional[int] = None
    #: A cron expression: the worker declares the schedule named after the topic when it starts.
    schedule: Optional[str] = None
    schedule_timezone: str = "UTC"

    @property
    def is_async(self) -> bool:
        """True for an ``async def`` handler, which runs on the worker's event loop."""
        return _is_async(self.handler)

    @property
    def slots(self) -> int:
        """Handlers of this consumer that may run at once (threads, or tasks for async handlers)."""
        if self.is_async:
            return self.concurrency or DEFAULT_CONCURRENCY
        return self.threads

    @property
    def name(self) -> str:
        return f"{getattr(self.handler, '__module__', '?')}.{getattr(self.handler, '__qualname__', '?')}"


def mq_consumer(topic: str, type: MessageType | str = MessageType.QUEUE, *, threads: int = 1,
                ttr: float = 60.0, batch: Optional[int] = None, ahead: float = DEFAULT_AHEAD,
                concurrency: Optional[int] = None, schedule: Optional[str] = None,
                schedule_timezone: str = "UTC") -> Callable[[Handler], Handler]:
    """Declare ``handler`` as the consumer of ``topic``.

    Returning from the handler records SUCCESS; raising records a failure, retried while the
    message has retries left, else FAIL. SERIAL_QUEUE consumers always run one at a time.
    The handler may be ``async def``: it then runs on the worker's event loop, ``concurrency``
    at once (not ``threads``), with the same leases, heartbeats, retries and drain.
    ``ahead``, ``schedule``: see :class:`ConsumerSpec`.
    """
    check_topic(topic)
    kind = MessageType.parse(type)
    if not 1 <= threads <= 1024:
        raise ConfigurationError(f"threads must be between 1 and 1024, got {threads}")
    if not MIN_TTR <= ttr <= MAX_TTR:
        raise ConfigurationError(f"ttr must be between {MIN_TTR} s and {MAX_TTR} s (7 days), got {ttr}")
    if batch is not None and not 1 <= batch <= MAX_PULL:
        raise ConfigurationError(f"batch must be between 1 and {MAX_PULL}, got {batch}")
    if not 0 <= ahead <= MAX_AHEAD:  # the lease covers ahead + ttr, so any ttr goes with it
        raise ConfigurationError(f"ahead must be between 0 and {MAX_AHEAD} s, got {ahead}")
    if concurrency is not None and not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ConfigurationError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
    if kind is MessageType.SERIAL_QUEUE:
        threads, batch = 1, 1
    if schedule is not None and (not isinstance(schedule, str) or not schedule.strip()):
        raise ConfigurationError(f"schedule must be a cron expression such as '*/5 * * * *', got {quote(schedule)}")
    if schedule is not None and kind is MessageType.TOPIC:
        raise ConfigurationError("schedule produces messages; TOPIC consumers receive broadcasts, which it cannot send")

    def register(handler: Handler) -> Handler:
        if _is_async(handler):
            if threads != 1:
                raise ConfigurationError(f"{topic}: an async def handler runs on the worker's event loop: "
                                         f"give concurrency={threads}, not threads")
            once = 1 if kind is MessageType.SERIAL_QUEUE else concurrency
            spec = ConsumerSpec(topic, kind, handler, 1, float(ttr), batch, float(ahead), once,
                                schedule, schedule_timezone)
        else:
            if concurrency is not None:
                raise ConfigurationError(f"{topic}: concurrency is for async def handlers; "
                                         f"a def handler runs on threads (threads={concurrency})")
            spec = ConsumerSpec(topic, kind, handler, threads, float(ttr), batch, float(ahead),
                                schedule=schedule, schedule_timezone=schedule_timezone)
        _REGISTRY.append(spec)
        return handler

    return register


def _is_async(handler: Any) -> bool:
    # Also an object whose __call__ is a coroutine function, the way a class-based handler is written.
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))


def registered_consumers() -> list[ConsumerSpec]:
    """Every consumer declared so far in this process."""
    return list(_REGISTRY)


def clear_registry() -> None:
    """Forget declared consumers (tests)."""
    _REGISTRY.clear()
