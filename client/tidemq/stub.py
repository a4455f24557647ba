"""StubBroker: an in-memory BrokerLink for testing consumers without a broker or a database.

>>> broker = StubBroker()
>>> msg_id = broker.produce("mail.send", {"to": "a"})
>>> Worker([spec], link=broker, coordinator=LocalCoordinator("/test")).start()   # doctest: +SKIP
>>> broker.status(msg_id) is MessageStatus.SUCCESS                               # doctest: +SKIP
True

It keeps the broker's rules that consumers rely on: leases with tokens and a ttr, QUEUE shards
``MOD(id, total) = rank``, SERIAL_QUEUE one RUNNING message per topic in (order_time, id) order,
acks refused as STALE once the lease is lost, retries back to NEW, long-polls that wake on
produce, ack, release and expiry and honour cancellation. Leases expire only when a test calls
:meth:`StubBroker.expire_leases`; times come from ``clock`` (seconds), so a test may inject its
own. Long-poll waits are real seconds. A call named in ``failing`` fails as it would while the
brokers' database is away (``StorageUnavailableError``), after being counted in ``calls``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional, Sequence

from .errors import PullCancelledError, StorageUnavailableError
from .lifecycle import Event, MessageStatus
from .link import AckItem, AckOutcome, Delivery, LeaseRef, PullHandle

__all__ = ["StubBroker", "StubMessage", "PullRecord"]


@dataclass
class StubMessage:
    """A stored message. ``extended`` counts the heartbeats and touches that extended its lease."""

    id: int
    topic: str
    data: str
    effect_time: float
    order_time: float  # the produced effect time: a retry moves effect_time, not its serial place
    retry_remaining: int
    status: MessageStatus = MessageStatus.NEW
    attempt: int = 0
    lease_token: str = ""
    lease_expire: float = 0.0
    ttr: float = 0.0
    consumer: str = ""
    trace_context: str = ""
    extended: int = 0
    error: str = ""
    leased_at: float = 0.0  # ``clock`` when its last lease was taken


@dataclass
class PullRecord:
    """One pull call. ``running_before``: RUNNING messages of the topic when it was made.
    ``outcome``: "waiting" while it long-polls, then "leased", "empty" or "cancelled"."""

    consumer: str
    rank: int
    total: int
    serial: bool
    lease_token: str
    running_before: int
    outcome: str = "waiting"
    ids: tuple[int, ...] = ()


@dataclass
class _Call:
    cancelled: bool = False


class StubBroker:
    """A thread-safe in-memory broker implementing :class:`tidemq.link.BrokerLink`.

    Inspect it with :meth:`status`, :meth:`message`, :meth:`ids`, and the records ``pulls``,
    ``releases`` (token, how many), ``extend_calls`` (the leases of each call), ``history``
    ((event, id): the trace events LOCKED, SUCCESS, RETRY, FAIL, RELEASED, LEASE_EXPIRED, and
    STALE for a refused ack), ``calls`` (per method) and ``peak_running`` (the most RUNNING
    messages of each topic at once).
    """

    #: The BrokerLink calls, the names ``calls`` counts and ``failing`` takes.
    CALLS = ("pull", "ack", "release", "extend", "touch")

    def __init__(self, clock: Callable[[], float] = time.time, default_ttr: float = 60.0,
                 retry_delay: float = 0.0) -> None:
        self.clock = clock
        self.default_ttr = default_ttr
        self.retry_delay = retry_delay
        self._cond = threading.Condition()  # re-entrant: a handle cancelled already aborts inside bind
        self._messages: dict[int, StubMessage] = {}
        self._next_id = itertools.count(1)
        self.pulls: list[PullRecord] = []
        self.releases: list[tuple[str, int]] = []
        self.extend_calls: list[tuple[LeaseRef, ...]] = []
        self.history: list[tuple[str, int]] = []
        self.calls: Counter[str] = Counter()
        self.peak_running: Counter[str] = Counter()
        self.failing: set[str] = set()  # calls that fail now, e.g. set(StubBroker.CALLS): an outage

    # -- test helpers ------------------------------------------------------------------------
    def produce(self, topic: str, data: Any = None, delay: float = 0.0, retry: int = 0,
                trace_context: str = "") -> int:
        """Store a message due ``delay`` seconds from now with ``retry`` retries (and the
        producer's W3C traceparent, if any); return its id."""
        with self._cond:
            due = self.clock() + delay
            msg = StubMessage(next(self._next_id), topic, json.dumps(data), due, due, retry,
                              trace_context=trace_context)
            self._messages[msg.id] = msg
            self._cond.notify_all()
            return msg.id

    def expire_leases(self, ids: Optional[Iterable[int]] = None) -> list[int]:
        """Return expired leases to NEW, as the broker's maintenance does: those past their
        expiry by ``clock``, or exactly ``ids`` (lost whatever their expiry). Returns the ids."""
        with self._cond:
            now, chosen = self.clock(), set(ids) if ids is not None else None
            expired = [m for m in self._messages.values() if m.status is MessageStatus.RUNNING
                       and (m.id in chosen if chosen is not None else m.lease_expire <= now)]
            for m in expired:
                self._to_new(m, Event.LEASE_EXPIRED, now)
            self._cond.notify_all()
            return [m.id for m in expired]

    def wake(self) -> None:
        """Make waiting pulls look again (after moving an injected clock)."""
        with self._cond:
            self._cond.notify_all()

    def status(self, msg_id: int) -> MessageStatus:
        """The message's state (a str enum: compares equal to its name)."""
        with self._cond:
            return self._messages[msg_id].status

    def message(self, msg_id: int) -> StubMessage:
        """A copy of the stored message."""
        with self._cond:
            return dataclasses.replace(self._messages[msg_id])

    def ids(self, topic: Optional[str] = None, status: Optional[str] = None) -> list[int]:
        """Ids of the messages of ``topic`` (all topics: None) in ``status`` (any: None)."""
        with self._cond:
            return [m.id for m in self._messages.values()
                    if (topic is None or m.topic == topic) and (status is None or m.status == status)]

    # -- BrokerLink --------------------------------------------------------------------------
    def pull(self, topic: str, consumer: str, *, rank: int = 0, total: int = 1, serial: bool = False,
             max_messages: int = 100, wait: float = 5.0, ttr: float = 0.0, lease_token: str = "",
             track: Optional[PullHandle] = None, ahead: float = 0.0) -> list[Delivery]:
        call = _Call()

        def abort() -> None:
            with self._cond:
                call.cancelled = True
                self._cond.notify_all()

        deadline = time.monotonic() + wait
        with self._cond:
            self._call("pull")
            token = lease_token or uuid.uuid4().hex
            record = PullRecord(consumer, rank, total, serial, token, len(self._running(topic)))
            self.pulls.append(record)
            if track is not None:
                track.bind(abort)
            try:
                while not call.cancelled:
                    leased = self._lease(topic, rank, total, serial, max_messages, ttr or self.default_ttr,
                                         consumer, token, ahead)
                    remaining = deadline - time.monotonic()
                    if leased or remaining <= 0:
                        record.outcome, record.ids = ("leased" if leased else "empty"), tuple(m.id for m in leased)
                        return [self._delivery(m) for m in leased]
                    # Like the broker: wake half the ahead window before the next due time.
                    until = self._until_due(topic, rank, total, serial) - ahead / 2
                    self._cond.wait(max(min(remaining, until), 0.001))
                record.outcome = "cancelled"
                raise PullCancelledError(f"pull of {topic} by {consumer} was cancelled")
            finally:
                if track is not None:
                    track.bind(None)

    def ack(self, topic: str, consumer: str, items: Sequence[AckItem],
            timeout: Optional[float] = None) -> list[AckOutcome]:
        with self._cond:
            self._call("ack")
            now, outcomes = self.clock(), []
            for item in items:
                m = self._held(item.id, item.lease_token)
                if m is None:
                    self.history.append((AckOutcome.STALE, item.id))
                    outcomes.append(AckOutcome.STALE)
                    continue
                outcomes.append(AckOutcome.APPLIED)
                if item.success:
                    self._finish(m, MessageStatus.SUCCESS, Event.SUCCESS)
                elif m.retry_remaining > 0:
                    m.retry_remaining -= 1
                    m.error = item.error
                    self._to_new(m, Event.RETRY, now + self.retry_delay)
                else:
                    m.error = item.error
                    self._finish(m, MessageStatus.FAIL, Event.FAIL)
            self._cond.notify_all()
            return outcomes

    def release(self, lease_token: str, consumer: str = "", timeout: Optional[float] = None) -> int:
        with self._cond:
            self._call("release")
            held = [m for m in self._messages.values()
                    if m.status is MessageStatus.RUNNING and m.lease_token == lease_token]
            for m in held:
                m.attempt -= 1  # given back unrun: the attempt does not count
                self._to_new(m, Event.RELEASED, m.effect_time)
            self.releases.append((lease_token, len(held)))
            self._cond.notify_all()
            return len(held)

    def extend(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
               timeout: Optional[float] = None) -> list[bool]:
        with self._cond:
            self._call("extend")
            self.extend_calls.append(tuple(leases))
            return [self._extend(lease.id, lease.lease_token, ttr) for lease in leases]

    def touch(self, msg_id: int, lease_token: str, ttr: float) -> bool:
        with self._cond:
            self._call("touch")
            return self._extend(msg_id, lease_token, ttr)

    # -- internals (called with the lock held) -----------------------------------------------
    def _call(self, method: str) -> None:
        self.calls[method] += 1
        if method in self.failing:
            raise StorageUnavailableError(f"{method}: the database is unavailable (StubBroker.failing)")

    def _running(self, topic: str) -> list[StubMessage]:
        return [m for m in self._messages.values() if m.topic == topic and m.status is MessageStatus.RUNNING]

    def _due(self, topic: str, rank: int, total: int, serial: bool) -> list[StubMessage]:
        """Candidates in lock order; serial: only the head, and only while nothing RUNNING."""
        new = [m for m in self._messages.values() if m.topic == topic and m.status is MessageStatus.NEW]
        if serial:
            if self._running(topic) or not new:
                return []
            return [min(new, key=lambda m: (m.order_time, m.id))]
        return sorted((m for m in new if m.id % total == rank), key=lambda m: (m.effect_time, m.id))

    def _lease(self, topic: str, rank: int, total: int, serial: bool, n: int, ttr: float, consumer: str,
               token: str, ahead: float = 0.0) -> list[StubMessage]:
        now = self.clock()
        chosen = [m for m in self._due(topic, rank, total, serial) if m.effect_time <= now + ahead][:n]
        for m in chosen:
            m.status, m.lease_token, m.lease_expire, m.ttr = MessageStatus.RUNNING, token, now + ahead + ttr, ttr
            m.consumer, m.leased_at = consumer, now
            m.attempt += 1
            self.history.append((Event.LOCKED, m.id))
        if chosen:
            self.peak_running[topic] = max(self.peak_running[topic], len(self._running(topic)))
        return chosen

    def _until_due(self, topic: str, rank: int, total: int, serial: bool) -> float:
        """Seconds until the shard's next message is due (1 s when nothing is pending)."""
        due = [m.effect_time for m in self._messages.values()
               if m.topic == topic and m.status is MessageStatus.NEW and (serial or m.id % total == rank)]
        return max(min(due) - self.clock(), 0.001) if due else 1.0

    def _held(self, msg_id: int, token: str) -> Optional[StubMessage]:
        m = self._messages.get(msg_id)
        return m if m is not None and m.status is MessageStatus.RUNNING and m.lease_token == token else None

    def _extend(self, msg_id: int, token: str, ttr: float) -> bool:
        m = self._held(msg_id, token)
        if m is None:
            return False
        m.lease_expire, m.ttr = self.clock() + ttr, ttr
        m.extended += 1
        return True

    def _to_new(self, m: StubMessage, event: Event, effect_time: float) -> None:
        m.status, m.lease_token, m.lease_expire, m.effect_time = MessageStatus.NEW, "", 0.0, effect_time
        self.history.append((event, m.id))

    def _finish(self, m: StubMessage, status: MessageStatus, event: Event) -> None:
        m.status, m.lease_token, m.lease_expire = status, "", 0.0
        self.history.append((event, m.id))

    def _delivery(self, m: StubMessage) -> Delivery:
        return Delivery(id=m.id, topic=m.topic, data=m.data,
                        effect_time=datetime.fromtimestamp(m.effect_time, tz=timezone.utc),
                        retry_remaining=m.retry_remaining, attempt=m.attempt, lease_token=m.lease_token, ttr=m.ttr,
                        trace_context=m.trace_context)
