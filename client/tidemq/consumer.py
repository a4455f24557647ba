"""``@mq_consumer``: declare a handler; ``tidemq worker`` (or a Worker) runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .errors import ConfigurationError
from .message import Message, MessageType
from .validation import check_topic

__all__ = ["ConsumerSpec", "mq_consumer", "registered_consumers", "clear_registry"]

Handler = Callable[[Message], None]
_REGISTRY: list["ConsumerSpec"] = []


@dataclass(frozen=True)
class ConsumerSpec:
    """A declared consumer.

    threads: handlers running at once. ttr: the lease length. While its worker lives, a message's
    lease is extended every ttr/3 (heartbeats), however long the handler runs; when the worker
    dies, its messages are delivered again about ttr seconds later. batch: messages pulled per
    call; at most ``threads + batch`` are leased and not yet acknowledged at any time.
    """

    topic: str
    type: MessageType
    handler: Handler
    threads: int = 1
    ttr: float = 60.0
    batch: int = 16

    @property
    def name(self) -> str:
        return f"{getattr(self.handler, '__module__', '?')}.{getattr(self.handler, '__qualname__', '?')}"


def mq_consumer(topic: str, type: MessageType | str = MessageType.QUEUE, *, threads: int = 1,
                ttr: float = 60.0, batch: Optional[int] = None) -> Callable[[Handler], Handler]:
    """Declare ``handler`` as the consumer of ``topic``.

    Returning from the handler records SUCCESS; raising records a failure, retried while the
    message has retries left, else FAIL. SERIAL_QUEUE consumers always run one at a time.
    """
    check_topic(topic)
    kind = MessageType.parse(type)
    if not 1 <= threads <= 1024:
        raise ConfigurationError(f"threads must be between 1 and 1024, got {threads}")
    if not 1 <= ttr <= 7 * 24 * 3600:
        raise ConfigurationError(f"ttr must be between 1 s and 7 days, got {ttr}")
    if batch is not None and not 1 <= batch <= 1000:
        raise ConfigurationError(f"batch must be between 1 and 1000, got {batch}")
    if kind is MessageType.SERIAL_QUEUE:
        threads, batch = 1, 1

    def register(handler: Handler) -> Handler:
        _REGISTRY.append(ConsumerSpec(topic, kind, handler, threads, float(ttr), batch or max(16, threads)))
        return handler

    return register


def registered_consumers() -> list[ConsumerSpec]:
    """Every consumer declared so far in this process."""
    return list(_REGISTRY)


def clear_registry() -> None:
    """Forget declared consumers (tests)."""
    _REGISTRY.clear()
