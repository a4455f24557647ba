"""The topics of the leases this broker's pulls granted, so that acks and heartbeats of them are
authorized without reading their messages' topics.

A caller whose token covers only some topics (``bench.*``, not ``*``) may ack, extend or touch a
message only if it covers the message's topic, and the call names ids, not topics: without this
map every Ack and every heartbeat of such a caller costs a read of its messages' topics (over
a third of what a broker spends on those calls while workers drain).

Why a remembered topic is as good as the row's: a message's topic never changes, and an Ack,
Extend or Touch changes a message only under the lease token it names. An entry is made by this
broker's Pull for exactly the (id, lease token) pairs it leased, with the topic of the row it
leased; a pair this broker did not lease (a pull at another broker, a restart, an entry aged
out or pushed out by newer ones) falls back to the read. The acking caller is authorized on the
topic either way, so a token that covers the topic is needed, whoever pulled.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable, Sequence

from .auth import authorize, checks_topics
from .storage import LeasedMessage

__all__ = ["LeaseGrants"]

Pair = tuple[int, str]


class LeaseGrants:
    """(message id, lease token) -> topic of the leases granted here, at most ``limit`` of them,
    each kept ``max_age`` seconds at most. Only pulls of callers that ``checks_topics`` are
    remembered: for every other caller no topic is ever read."""

    def __init__(self, limit: int = 50_000, max_age: float = 3600.0) -> None:
        self._limit = limit
        self._max_age = max_age
        self._topics: OrderedDict[Pair, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._topics)

    def remember(self, found: Sequence[LeasedMessage]) -> None:
        """Note the leases a pull is about to hand its caller (when the caller's topics count)."""
        if not found or not checks_topics():
            return
        now = time.monotonic()
        with self._lock:
            for msg in found:
                if msg.lease_token:
                    self._topics[(msg.id, msg.lease_token)] = (msg.topic, now)
            # Oldest first: what a dead consumer never acked leaves by age or by count.
            while self._topics:
                _, (_, since) = next(iter(self._topics.items()))
                if len(self._topics) <= self._limit and now - since <= self._max_age:
                    break
                self._topics.popitem(last=False)

    def authorize(self, method: str, pairs: Sequence[Pair], read: Callable[[list[int]], set[str]]) -> None:
        """``authorize`` the caller's ``method`` on the messages ``pairs`` name (their topics
        looked up only for a caller whose patterns do not cover every topic)."""
        authorize(method, self.topics(pairs, read) if checks_topics() else ())

    def topics(self, pairs: Iterable[Pair], read: Callable[[list[int]], set[str]]) -> set[str]:
        """The topics of the messages ``pairs`` name: remembered ones from here, the rest by
        ``read`` (one call with their ids, none when every pair is known)."""
        known: set[str] = set()
        unknown: list[int] = []
        for pair in pairs:
            entry = self._topics.get(pair)
            if entry is None:
                unknown.append(pair[0])
            else:
                known.add(entry[0])
        return known | read(unknown) if unknown else known

    def forget(self, pairs: Sequence[Pair]) -> None:
        """Drop the leases an Ack ended (whatever its outcome: a refused one holds nothing)."""
        if not self._topics:  # a broker without tokens, or callers that cover every topic
            return
        with self._lock:
            for pair in pairs:
                self._topics.pop(pair, None)
