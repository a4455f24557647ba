"""Small helpers the scenarios share: pull with a scenario's defaults, ack deliveries."""

from __future__ import annotations

from typing import Any, Sequence

from tidemq.link import AckItem, AckOutcome, Delivery

CONSUMER = "behaviour-consumer"


def pull(double: Any, topic: str, *, wait: float = 0.0, max_messages: int = 10, **options: Any) -> list[Delivery]:
    """One pull by CONSUMER; ``wait`` 0 takes only what is due now."""
    return double.link.pull(topic, CONSUMER, wait=wait, max_messages=max_messages, **options)


def ack(double: Any, topic: str, deliveries: Sequence[Delivery], error: str = "") -> list[AckOutcome]:
    """Report ``deliveries`` done (``error`` given: failed with it) under their own leases."""
    return double.link.ack(topic, CONSUMER, [AckItem(d.id, d.lease_token, not error, error) for d in deliveries])


def seconds(delta: Any) -> float:
    return delta.total_seconds()
