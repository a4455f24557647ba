"""TOPIC: every online worker drops its cached copy when told to."""

import logging

from tidemq import Message, MessageType, mq_consumer

log = logging.getLogger("tidemq.examples.cache")
cache: dict = {"users": "cached"}


@mq_consumer("example.cache.refresh", type=MessageType.TOPIC)
def refresh(message: Message) -> None:
    """Runs in every worker online when the broadcast was sent."""
    cache.pop(message.data.get("key"), None)
    log.info("cache key %s dropped (broadcast %d)", message.data.get("key"), message.id)
