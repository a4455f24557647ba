"""Result retention: the results (and progress) of finished messages older than their topic's
``result_retention_seconds`` are cleared in batches; the messages themselves stay."""

from __future__ import annotations

from datetime import timedelta

from tidemq import clock
from tidemq.lifecycle import DEFAULT_RESULT_RETENTION

from ..storage import MessageWrites, TopicStore
from .retention import in_batches

__all__ = ["ResultRetention"]


class ResultRetention:
    """Clears the result and progress of SUCCESS, FAIL and CANCELLED messages finished longer
    ago than their topic keeps results (``result_retention_seconds``; unset: a day).

    A result is usually wanted for seconds (a waiter) or hours (a caller that comes back for
    it); the message row itself is kept by the topic's (longer) message retention.
    """

    name = "result_retention"

    def __init__(self, topics: TopicStore, messages: MessageWrites, interval: float = 60.0,
                 batch: int = 1000) -> None:
        self._topics = topics
        self._messages = messages
        self.interval = interval
        self._batch = batch

    def run(self) -> int:
        total = 0
        now = clock.now()
        for settings in self._topics.list_topics():
            seconds = settings.result_retention_seconds
            before = now - timedelta(seconds=DEFAULT_RESULT_RETENTION if seconds is None else max(seconds, 0))
            total += in_batches(lambda n, t=settings.name, b=before: self._messages.forget_results(t, b, n),
                                self._batch)
        return total
