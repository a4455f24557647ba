"""StubBroker: an in-memory broker for testing producers and consumers without a broker or a database.

>>> coordinator = LocalCoordinator("/test")
>>> broker = StubBroker(coordinator=coordinator)
>>> msg_id = broker.produce("mail.send", {"to": "a"})
>>> Worker([spec], link=broker, coordinator=coordinator).start()                  # doctest: +SKIP
>>> broker.status(msg_id) is MessageStatus.SUCCESS                               # doctest: +SKIP
True

Every transition is the one :mod:`tidemq.lifecycle` decides, applied to the message as the
broker's storage applies it (``Change.allows`` / ``Change.apply_to``), each change of a RUNNING
message guarded by its lease token: leases in ``(priority DESC, effect_time, id)`` order on
QUEUE shards ``MOD(id, total) = rank``, SERIAL_QUEUE one RUNNING message per topic in
``(order_time, id)`` order, retries after ``next_delay`` (a schedule, or the topic's backoff),
FAIL once retries run out, lease expiry back to NEW or to FAIL after ``max_deliveries``, acks
refused as STALE once the lease is lost (a repeated one answered as recorded), releases that do
not count an attempt, cancel and requeue, dependencies (``depends_on``, :meth:`StubBroker.submit`;
``stub_producing.py``), workflows (``workflow_state``, workflow handles, ``cancel_workflow``;
``stub_workflows.py``). Topics have the broker's defaults; :meth:`set_topic`
changes them (``retry_base=0`` retries at once). ``tests/behaviour`` runs the same scenarios
against this stub and a real broker.

Where it differs: leases expire only when a test calls :meth:`StubBroker.expire_leases`; a
ttr is kept as given (the broker rounds it to whole seconds, at least 1), so unit tests may
beat fast; there are no flow limits and no stranded-shard takeover; every workflow runs under the policy
stop (no wait modes). Input is checked as the broker checks it (``tidemq.validation``,
``tidemq.limits``). Times come from ``clock`` (seconds), so a test may inject its own; long-poll
waits are real seconds. A call named in ``failing`` fails as it would while the brokers' database
is away (``StorageUnavailableError``), after being counted in ``calls``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Optional, Sequence

from . import lifecycle
from .clock import after
from .coordinator import Coordinator
from .errors import MalformedRequestError, PullCancelledError, StorageUnavailableError
from .lifecycle import Change, MessageStatus
from .limits import check_lease_token, new_lease_token
from .link import AckItem, AckOutcome, Delivery, LeaseRef, PullHandle
from .stub_producing import StubProducing
from .stub_results import StubResults
from .stub_workflows import StubWorkflows
from .stub_types import PullRecord, StubMessage, StubTopic, delivery_of, stored_time
from .tables import MESSAGE as M
from .validation import check_batch_size, check_lease_ttr, check_pull

__all__ = ["StubBroker", "StubTopic", "StubMessage", "PullRecord"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value
#: The statuses an applied ack leaves: a repeat of it finds one of them.
_RECORDED = {(True, False): {MessageStatus.SUCCESS.value}, (False, False): {MessageStatus.FAIL.value,
             MessageStatus.CANCELLED.value}, (False, True): {MessageStatus.CANCELLED.value},
             (True, True): {MessageStatus.CANCELLED.value}}


@dataclass
class _Call:
    cancelled: bool = False


class StubBroker(StubProducing, StubResults, StubWorkflows):
    """A thread-safe in-memory broker implementing :class:`tidemq.link.BrokerLink` and the
    producer calls of :class:`tidemq.Client` (produce, produce_many and submit, with
    dependencies; cancel, requeue, results; ``result=True`` returns handles).

    Inspect it with :meth:`status`, :meth:`message`, :meth:`ids`, and the records ``pulls``,
    ``releases`` (token, how many), ``extend_calls`` (the leases of each call), ``history``
    ((event, id) for each trace line written: PRODUCED, LOCKED, SUCCESS, RETRY, FAIL, RELEASED,
    LEASE_EXPIRED, CANCELLED, REQUEUED; and STALE for a refused ack), ``calls`` (per method) and
    ``peak_running`` (the most RUNNING messages of each topic at once).
    """

    #: The BrokerLink calls, the names ``calls`` counts and ``failing`` takes.
    CALLS = ("pull", "ack", "release", "extend", "touch")

    def __init__(self, clock: Callable[[], float] = time.time, default_ttr: float = lifecycle.DEFAULT_TTR,
                 name: str = "stub", coordinator: Optional[Coordinator] = None, **topic_defaults: Any) -> None:
        """``topic_defaults``: fields of :class:`StubTopic` every topic starts with.
        ``coordinator``: the one the workers under test use; a cancel of running messages
        signals their topics through it, as a broker does (without it, a worker learns of the
        cancel at its next heartbeat or progress report)."""
        self.clock = clock
        self.name = name
        self.coordinator = coordinator
        self._defaults = StubTopic(ttr=default_ttr, **topic_defaults)
        self._topics: dict[str, StubTopic] = {}
        self._cond = threading.Condition()  # re-entrant: a handle cancelled already aborts inside bind
        self._rows: dict[int, dict[str, Any]] = {}  # id -> {column of tidemq.tables.MESSAGE: value}
        self._extended: Counter[int] = Counter()
        self._errors: dict[int, str] = {}
        self._next_id = itertools.count(1)
        self.pulls: list[PullRecord] = []
        self.releases: list[tuple[str, int]] = []
        self.extend_calls: list[tuple[LeaseRef, ...]] = []
        self.history: list[tuple[str, int]] = []
        self.calls: Counter[str] = Counter()
        self.peak_running: Counter[str] = Counter()
        self.failing: set[str] = set()  # calls that fail now, e.g. set(StubBroker.CALLS): an outage
        self._init_dependencies()
        self._init_workflows()

    # -- topics and inspection ---------------------------------------------------------------
    def set_topic(self, topic: str, **settings: Any) -> StubTopic:
        """Change ``topic``'s settings (fields of :class:`StubTopic`); return them."""
        with self._cond:
            self._topics[topic] = replace(self.topic(topic), **settings)
            self._cond.notify_all()
            return self._topics[topic]

    def topic(self, topic: str) -> StubTopic:
        """``topic``'s settings (the defaults for a topic never set)."""
        with self._cond:
            return self._topics.get(topic, self._defaults)

    def wake(self) -> None:
        """Make waiting pulls look again (after moving an injected clock)."""
        with self._cond:
            self._cond.notify_all()

    def status(self, msg_id: int) -> MessageStatus:
        """The message's state (a str enum: compares equal to its name)."""
        with self._cond:
            return MessageStatus(self._rows[msg_id][M.status])

    def message(self, msg_id: int) -> StubMessage:
        """A copy of the stored message."""
        with self._cond:
            return StubMessage.of(self._rows[msg_id], self._extended[msg_id], self._errors.get(msg_id, ""))

    def ids(self, topic: Optional[str] = None, status: Optional[str] = None) -> list[int]:
        """Ids of the messages of ``topic`` (all topics: None) in ``status`` (any: None)."""
        with self._cond:
            return [i for i, row in self._rows.items()
                    if (topic is None or row[M.topic] == topic) and (status is None or row[M.status] == status)]

    # -- producing and managing --------------------------------------------------------------
    def cancel(self, msg_id: int, timeout: Optional[float] = None, *, running: bool = False) -> bool:
        """Delete a message that is still NEW (``running``: or mark a RUNNING one); False if it is
        running, done or gone."""
        return self.cancel_many([msg_id], running=running)[0]

    def cancel_many(self, ids: Sequence[int], timeout: Optional[float] = None, *,
                    running: bool = False) -> list[bool]:
        """Cancel many messages at once; one bool per id."""
        check_batch_size(ids, "ids")
        with self._cond:
            gone = [msg_id in self._rows and self._apply(self._rows[msg_id], lifecycle.cancel()) for msg_id in ids]
            marked, topics = self._cancel_running(ids) if running else ([False] * len(ids), set())
            self._cond.notify_all()
        self._signal_cancels(topics)
        return [a or b for a, b in zip(gone, marked)]

    def requeue(self, ids: Optional[Sequence[int]] = None, *, topic: Optional[str] = None, retry: int = 0,
                timeout: Optional[float] = None) -> int:
        """Put FAIL messages back to NEW, due now, by id or every one of ``topic``; return how many."""
        if bool(ids) == bool(topic):
            raise MalformedRequestError("requeue takes either ids or a topic, not both and not neither")
        if retry < 0:
            raise MalformedRequestError(f"retry must be 0 or more, got {retry}")
        with self._cond:
            change = lifecycle.requeue(self._now(), retry, broker=self.name)
            chosen = [row for row in self._rows.values() if (row[M.id] in ids if ids else row[M.topic] == topic)]
            moved = sum(self._apply(row, change) for row in chosen)
            self._cond.notify_all()
            return moved

    def expire_leases(self, ids: Optional[Iterable[int]] = None) -> list[int]:
        """Run lease expiry as the broker's leader does: RUNNING messages whose lease ran out by
        ``clock`` (or exactly ``ids``, lost whatever their expiry) go back to NEW, or to FAIL once
        delivered their topic's ``max_deliveries`` times. Returns the ids moved."""
        with self._cond:
            now, chosen = self._now(), set(ids) if ids is not None else None
            moved = []
            for row in list(self._rows.values()):
                if row[M.status] != _RUNNING or (row[M.id] not in chosen if chosen is not None
                                                 else row[M.lease_expire] >= now):
                    continue
                most = self.topic(row[M.topic]).max_deliveries
                expiries = lifecycle.lease_expiries(row[M.trace]) + 1
                change = lifecycle.expire(now, row[M.attempt], most, row[M.consumer], self.name, expiries,
                                          cancel_requested=bool(row[M.cancel_requested]))
                if self._apply(row, change):
                    moved.append(row[M.id])
            self._cond.notify_all()
            return moved

    # -- BrokerLink --------------------------------------------------------------------------
    def pull(self, topic: str, consumer: str, *, rank: int = 0, total: int = 1, serial: bool = False,
             max_messages: int = 100, wait: float = 5.0, ttr: float = 0.0, lease_token: str = "",
             track: Optional[PullHandle] = None, ahead: float = 0.0, hold: float = 0.0) -> list[Delivery]:
        check_pull(topic, rank=rank, total=total, max_messages=max_messages, wait=wait, ttr=ttr, ahead=ahead,
                   consumer=consumer, lease_token=lease_token, hold=hold)
        call = _Call()

        def abort() -> None:
            with self._cond:
                call.cancelled = True
                self._cond.notify_all()

        deadline = time.monotonic() + wait
        rank, total = (0, 1) if serial else (rank, total)
        with self._cond:
            self._call("pull")
            token = lease_token or new_lease_token()
            record = PullRecord(consumer, rank, total, serial, token, len(self._running(topic)))
            self.pulls.append(record)
            if track is not None:
                track.bind(abort)
            try:
                while not call.cancelled:
                    leased = self._lease(topic, rank, total, serial, max_messages, ttr, consumer, token, ahead, hold)
                    remaining = deadline - time.monotonic()
                    if leased or remaining <= 0:
                        record.outcome, record.ids = ("leased" if leased else "empty"), tuple(r[M.id] for r in leased)
                        return [delivery_of(row, self._parents.get(row[M.id], ()), self._workflow_of.get(row[M.id]))
                                for row in leased]
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
        check_batch_size(items, "acks")
        with self._cond:
            self._call("ack")
            now, outcomes = self._now(), []
            for item in items:
                row = self._rows.get(item.id)
                if row is None or not _holds(row, item.lease_token):
                    # A repeat of an ack this lease already recorded is answered as applied.
                    done = _RECORDED[(item.success, item.cancelled)]
                    repeat = row is not None and row[M.status] in done and row[M.lease_token] == item.lease_token
                    if not repeat:
                        self.history.append((AckOutcome.STALE, item.id))
                    outcomes.append(AckOutcome.APPLIED if repeat else AckOutcome.STALE)
                    continue
                if item.cancelled:
                    change = lifecycle.cancelled(now, consumer, self.name)
                elif item.success:
                    change = lifecycle.succeed(now, consumer, self.name, item.result)
                else:
                    self._errors[item.id] = item.error
                    change = lifecycle.fail_attempt(_attempted(row), self.topic(row[M.topic]), item.error, now,
                                                    consumer, self.name, result=item.result,
                                                    cancel_requested=bool(row[M.cancel_requested]))
                self._apply(row, change, item.lease_token)
                outcomes.append(AckOutcome.APPLIED)
            self._cond.notify_all()
            return outcomes

    def release(self, lease_token: str, consumer: str = "", timeout: Optional[float] = None) -> int:
        check_lease_token(lease_token)
        with self._cond:
            self._call("release")
            change = lifecycle.release(self._now(), consumer or "-", self.name)
            stop = lifecycle.cancelled(self._now(), consumer or "-", self.name, error="released")
            released = sum(self._apply(row, stop if row[M.cancel_requested] else change, lease_token)
                           for row in list(self._rows.values()))
            self.releases.append((lease_token, released))
            self._cond.notify_all()
            return released

    def extend(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
               timeout: Optional[float] = None) -> list[bool]:
        check_batch_size(leases, "leases")
        for lease in leases:
            check_lease_token(lease.lease_token)
        check_lease_ttr(ttr)
        with self._cond:
            self._call("extend")
            self.extend_calls.append(tuple(leases))
            return [self._extend(lease.id, lease.lease_token, ttr) for lease in leases]

    def touch(self, msg_id: int, lease_token: str, ttr: float) -> bool:
        check_lease_ttr(ttr)
        with self._cond:
            self._call("touch")
            return self._extend(msg_id, lease_token, ttr)

    # -- internals (called with the lock held) -----------------------------------------------
    def _now(self) -> datetime:
        return stored_time(self.clock())

    def _new_id(self) -> int:
        return next(self._next_id)

    def _call(self, method: str) -> None:
        self.calls[method] += 1
        if method in self.failing:
            raise StorageUnavailableError(f"{method}: the database is unavailable (StubBroker.failing)")

    def _apply(self, row: dict[str, Any], change: Change, lease_token: Optional[str] = None) -> bool:
        """Apply ``change`` to ``row`` if its guard (and ``lease_token``) allows it; say whether."""
        if not change.allows(row) or (lease_token is not None and row[M.lease_token] != lease_token):
            return False
        if change.delete:
            del self._rows[row[M.id]]
        else:
            change.apply_to(row)
        if change.trace or change.delete:
            self.history.append((change.event, row[M.id]))
        self._ended(row[M.id], change)  # what waits on it: released or stopped
        self._workflow_step_ended(row[M.id])
        return True

    def _running(self, topic: str) -> list[dict[str, Any]]:
        return [row for row in self._rows.values() if row[M.topic] == topic and row[M.status] == _RUNNING]

    def _due(self, topic: str, rank: int, total: int, serial: bool) -> list[dict[str, Any]]:
        """Candidates in lock order; serial: only the head, and only while nothing RUNNING."""
        new = [row for row in self._rows.values() if row[M.topic] == topic and row[M.status] == _NEW]
        if serial:
            if self._running(topic) or not new:
                return []
            return [min(new, key=lambda row: (row[M.order_time], row[M.id]))]
        return sorted((row for row in new if row[M.id] % total == rank),
                      key=lambda row: (-row[M.priority], row[M.effect_time], row[M.id]))

    def _lease(self, topic: str, rank: int, total: int, serial: bool, n: int, ttr: float, consumer: str,
               token: str, ahead: float, hold: float = 0.0) -> list[dict[str, Any]]:
        settings = self.topic(topic)
        if settings.paused:
            return []
        now = self._now()
        due_by = after(now, ahead)
        chosen = [row for row in self._due(topic, rank, total, serial) if row[M.effect_time] <= due_by][:n]
        if chosen:
            who = {} if serial else {"rank": f"{rank}/{total}"}
            change = lifecycle.lease(now, ttr or settings.ttr, consumer, token, ahead, hold, **who, broker=self.name)
            for row in chosen:
                self._apply(row, change)
            self.peak_running[topic] = max(self.peak_running[topic], len(self._running(topic)))
        return chosen

    def _until_due(self, topic: str, rank: int, total: int, serial: bool) -> float:
        """Seconds until the shard's next message is due (1 s when nothing is pending)."""
        due = [row[M.effect_time] for row in self._rows.values()
               if row[M.topic] == topic and row[M.status] == _NEW and (serial or row[M.id] % total == rank)]
        return max((min(due) - self._now()).total_seconds(), 0.001) if due else 1.0

    def _extend(self, msg_id: int, token: str, ttr: float) -> bool:
        row = self._rows.get(msg_id)
        if row is None or not self._apply(row, lifecycle.extend(self._now(), ttr), token):
            return False
        self._extended[msg_id] += 1
        return True


def _holds(row: dict[str, Any], token: str) -> bool:
    return row[M.status] == _RUNNING and row[M.lease_token] == token


def _attempted(row: dict[str, Any]) -> SimpleNamespace:
    """What :func:`tidemq.lifecycle.fail_attempt` reads of a message."""
    return SimpleNamespace(retry_remaining=row[M.retry_remaining], retry_schedule=row[M.retry_schedule],
                           attempt=row[M.attempt])
