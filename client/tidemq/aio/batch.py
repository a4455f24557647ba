"""BatchConsumer for asyncio: pull many messages, report many outcomes, without blocking the loop."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from ..batch import AckResult, PulledLeases
from ..errors import ConfigurationError
from ..message import Message
from ..queue_runner import delivery_to_message
from ..validation import check_topic
from ..worker import default_instance

if TYPE_CHECKING:
    from .client import AsyncClient

__all__ = ["BatchConsumer"]


def _blocking_touch(_ttr: float) -> bool:
    raise ConfigurationError("a message pulled by tidemq.aio.BatchConsumer is extended with "
                             "`await consumer.touch(message)`, not message.touch()")


class BatchConsumer:
    """:class:`tidemq.BatchConsumer` with coroutines.

    >>> consumer = BatchConsumer("report.build", ttr=60)
    >>> batch = await consumer.pull(max_messages=100, wait=5.0)       # doctest: +SKIP
    >>> await consumer.ack(succeeded=[m.id for m in batch])           # doctest: +SKIP

    ``client`` defaults to this event loop's :class:`AsyncClient` (``tidemq.aio.client()``).
    Each pulled message has a ``process`` span from pull to ack, as with the threaded one;
    ``with consumer.processing(message):`` makes it current.
    """

    def __init__(self, topic: str, ttr: float = 60.0, client: Optional["AsyncClient"] = None,
                 name: Optional[str] = None) -> None:
        self.topic = check_topic(topic)
        self.ttr = ttr
        self._client = client
        self.name = name or f"batch-{default_instance()}"
        self._leases = PulledLeases()

    @property
    def client(self) -> "AsyncClient":
        if self._client is None:
            from . import client  # the default client is per event loop: resolve it inside one

            self._client = client()
        return self._client

    async def pull(self, max_messages: int = 100, wait: float = 5.0) -> list[Message]:
        """Lease up to ``max_messages`` due messages, waiting up to ``wait`` seconds for the first."""
        deliveries = await self.client.pull(self.topic, self.name, max_messages=max_messages, wait=wait, ttr=self.ttr)
        self._leases.remember(deliveries)
        messages = [delivery_to_message(d, touch=_blocking_touch) for d in deliveries]
        for message in messages:  # inputs are read on this loop: await message.ainputs()
            message._aresults = self.client.results
        return messages

    async def ack(self, succeeded: Sequence[int] = (),
                  failed: Union[Sequence[int], Mapping[int, str]] = (),
                  results: Optional[Mapping[int, Any]] = None) -> AckResult:
        """Record successes and failures (optionally {id: error text}) in one transaction, with
        ``results`` ({id: JSON value} of succeeded messages) stored with their SUCCESS."""
        items = self._leases.items(succeeded, failed, results)
        return self._leases.result(items, await self.client.ack(self.topic, self.name, items))

    def processing(self, message: Message) -> "contextlib.AbstractContextManager[Any]":
        """Make ``message``'s ``process`` span current for a block (a ``with``, not ``async with``)."""
        return self._leases.processing(message.id)

    async def touch(self, message: Message, ttr: Optional[float] = None) -> bool:
        """Extend ``message``'s lease by ``ttr`` seconds from now (default: this consumer's ttr);
        False when it was already lost."""
        token = self._leases.token(message.id)
        return await self.client.touch(message.id, token, ttr if ttr is not None else self.ttr)
