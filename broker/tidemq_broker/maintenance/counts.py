"""The leader's count of messages per topic and status, stored for the console."""

from __future__ import annotations

import time

from tidemq import clock

from ..storage import Counts

__all__ = ["TopicCounts"]


class TopicCounts:
    """Counts every topic's messages by status and stores the result (``tidemq_topic_count``).

    One GROUP BY over the whole message table: about a third of a second per million rows on
    the test machine. It runs every ``interval`` seconds, or less often on tables where the
    count itself takes long (never more than 1/``budget`` of the wall clock), so the console's
    pages stay fast on large tables while its counts of finished messages lag by that much.
    """

    name = "topic-counts"

    def __init__(self, counts: Counts, interval: float = 10.0, budget: float = 20.0) -> None:
        self._counts = counts
        self._base = interval
        self._budget = budget
        self.interval = interval

    def run(self) -> int:
        started = time.monotonic()
        counts = self._counts.count_by_status()
        self._counts.save_topic_counts(counts, clock.now())
        self.interval = max(self._base, (time.monotonic() - started) * self._budget)
        return sum(n for by_status in counts.values() for n in by_status.values())
