"""Retention: SUCCESS messages older than their topic's retention are deleted in batches."""

from __future__ import annotations

from datetime import timedelta
from typing import Callable

from tidemq import clock
from tidemq.lifecycle import retention_deletes_success
from ..storage import MessageWrites, TopicStore

__all__ = ["Retention", "in_batches"]


class Retention:
    """Deletes SUCCESS messages past each topic's ``retention_days``.

    FAIL messages are kept: they are the dead letters, left for an operator or the archive.
    Topics with ``archive`` set (or ``retention_days`` 0) are left to the archive pipeline, so
    the two never race for the same rows.
    """

    name = "retention"

    def __init__(self, topics: TopicStore, messages: MessageWrites, interval: float = 60.0, batch: int = 1000) -> None:
        self._topics = topics
        self._messages = messages
        self.interval = interval
        self._batch = batch

    def run(self) -> int:
        total = 0
        now = clock.now()
        for settings in self._topics.list_topics():
            if not retention_deletes_success(settings.retention_days, settings.archive):
                continue
            before = now - timedelta(days=settings.retention_days)
            total += in_batches(lambda n, t=settings.name, b=before: self._messages.delete_finished(t, b, n),
                                self._batch)
        return total


def in_batches(step: Callable[[int], int], batch: int) -> int:
    """Call ``step(batch)`` (which handles at most ``batch`` rows and says how many) until a call
    handles fewer; the total. Short transactions: other writers wait for none of them long."""
    total = 0
    while True:
        done = step(batch)
        total += done
        if done < batch:
            return total
