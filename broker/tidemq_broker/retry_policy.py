"""How long a failed message waits before its next attempt."""

from __future__ import annotations

import random

from .storage import StoredMessage, TopicSettings

__all__ = ["next_delay"]


def next_delay(msg: StoredMessage, settings: TopicSettings, rng: random.Random = random.Random()) -> float:
    """Seconds until the next attempt of ``msg``, which still has retries left.

    With a schedule, entry k is the delay before retry k+1. Otherwise the topic's backoff:
    ``retry_base * 2**k`` capped at ``retry_max``, with jitter in [50 %, 100 %] so that a burst
    of failures does not come back as a burst.
    """
    if msg.retry_schedule:
        used = len(msg.retry_schedule) - msg.retry_remaining
        return float(msg.retry_schedule[min(max(used, 0), len(msg.retry_schedule) - 1)])
    used = max(msg.attempt - 1, 0)
    ceiling = min(settings.retry_base * (2 ** min(used, 40)), settings.retry_max)
    return ceiling * rng.uniform(0.5, 1.0)
