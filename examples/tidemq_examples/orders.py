"""QUEUE: closing unpaid orders after a delay, shared by every running worker."""

import logging

from tidemq import Message, MessageType, mq_consumer

log = logging.getLogger("tidemq.examples.orders")


@mq_consumer("example.order.close", type=MessageType.QUEUE, threads=4)
def close_order(message: Message) -> None:
    """Close the order unless it was paid; raising would retry it later."""
    order_id = message.data.get("order_id") if isinstance(message.data, dict) else message.data
    log.info("order %s closed (message %d, attempt %d)", order_id, message.id, message.attempt)
