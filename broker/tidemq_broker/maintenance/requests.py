"""Produce request ids: forgotten by the leader once older than the promised window."""

from __future__ import annotations

from datetime import timedelta

from tidemq import clock
from ..storage import MessageWrites

__all__ = ["ProduceRequests", "PRODUCE_REQUEST_HOURS"]

#: How long a Produce call's request id is kept: a client retrying a call later than this may
#: store it twice. Clients give up on a call within seconds (TIDEMQ_RPC_TIMEOUT).
PRODUCE_REQUEST_HOURS = 24


class ProduceRequests:
    """Deletes request ids older than ``hours`` (never fewer than 24), in batches."""

    name = "produce-requests"

    def __init__(self, messages: MessageWrites, hours: float = PRODUCE_REQUEST_HOURS, interval: float = 300.0,
                 batch: int = 5000) -> None:
        self._messages = messages
        self._keep = timedelta(hours=max(hours, PRODUCE_REQUEST_HOURS))
        self.interval = interval
        self._batch = batch

    def run(self) -> int:
        before = clock.now() - self._keep
        total = 0
        while True:
            deleted = self._messages.delete_produce_requests(before, self._batch)
            total += deleted
            if deleted < self._batch:
                return total
