"""SERIAL_QUEUE: ledger entries applied one at a time, in order, by one worker of the cluster."""

import logging

from tidemq import Message, MessageType, mq_consumer

log = logging.getLogger("tidemq.examples.ledger")
balance = {"total": 0}


@mq_consumer("example.ledger", type=MessageType.SERIAL_QUEUE)
def apply_entry(message: Message) -> None:
    """Order matters here: each entry builds on the balance the previous one left."""
    balance["total"] += int(message.data.get("amount", 0))
    log.info("ledger entry %d applied, balance %d", message.id, balance["total"])
