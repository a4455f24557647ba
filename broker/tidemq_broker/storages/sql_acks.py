"""Acks, lease release and lease extension: the outcome side of the SQL storage.

A mixin of :class:`tidemq_broker.storages.sql.SqlStorage`: it uses the storage's ``_tx``.
Every change here is guarded by ``status = 'RUNNING'`` and the lease token, so an outcome from a
consumer that lost its lease is refused, never applied.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from sqlalchemy import Connection, select, update

from .. import clock, trace
from ..schema import message as m
from ..storage import AckItem, AckOutcome, Backoff, StoredMessage, TopicSettings
from .ids import ids_in
from .sql_reads import to_message

__all__ = ["SqlAcks"]

_CHUNK = 1000


class _SomeStale(Exception):
    """Raised inside an ack's fast path to roll it back when an item's lease was lost."""


class SqlAcks:
    """Outcomes and leases, shared by every SQL dialect."""

    _tx: Callable[..., Any]
    topics_present: Callable[[Connection], list[str]]

    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings], backoff: Backoff) -> list[AckOutcome]:
        if items and all(item.success for item in items) and len({item.id for item in items}) == len(items):
            try:
                return self._tx(lambda conn: self._ack_all_succeeded(conn, items, now, consumer, broker))
            except _SomeStale:
                pass  # rolled back: sort the batch out item by item below
        return self._ack_each(items, now, consumer, broker, topics, backoff)

    def _ack_all_succeeded(self, conn: Connection, items: Sequence[AckItem], now: datetime, consumer: str,
                           broker: str) -> list[AckOutcome]:
        """The common case in one statement per lease token instead of a locking read first.

        A row is marked only while it is RUNNING under the very token the item names (tokens are
        per pulled batch). If any item does not match, the transaction is rolled back and the
        exact path decides each outcome.
        """
        by_token: dict[str, list[int]] = {}
        for item in items:
            by_token.setdefault(item.lease_token, []).append(item.id)
        line = trace.line(now, "SUCCESS", consumer=consumer, broker=broker)
        for token, ids in by_token.items():
            if _mark_succeeded(conn, ids, now, line, m.c.lease_token == token) != len(ids):
                raise _SomeStale()
        return [AckOutcome.APPLIED] * len(items)

    def _ack_each(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
                  topics: Callable[[str], TopicSettings], backoff: Backoff) -> list[AckOutcome]:
        def work(conn: Connection) -> list[AckOutcome]:
            ids = sorted({item.id for item in items})
            # Only the lease tokens are needed to judge the acks: reading (and decoding) whole
            # rows with their data and trace was most of an ack's cost. Failures, the rare
            # case, read their full row below for the retry decision.
            held: dict[int, Optional[str]] = {}
            for start in range(0, len(ids), _CHUNK):
                stmt = (select(m.c.id, m.c.lease_token)
                        .where(ids_in(ids[start : start + _CHUNK]), m.c.status == "RUNNING").with_for_update())
                held.update((row.id, row.lease_token) for row in conn.execute(stmt))
            outcomes: list[AckOutcome] = []
            succeeded: list[int] = []
            failed: list[AckItem] = []
            for item in items:
                if item.id not in held or held.pop(item.id) != item.lease_token:
                    outcomes.append(AckOutcome.STALE)
                    continue
                outcomes.append(AckOutcome.APPLIED)
                if item.success:
                    succeeded.append(item.id)
                else:
                    failed.append(item)
            if failed:
                rows = conn.execute(select(m).where(m.c.id.in_([item.id for item in failed])))
                full = {row.id: to_message(row) for row in rows}
                for item in failed:
                    msg = full[item.id]
                    self._fail_one(conn, msg, item.error, now, consumer, broker, topics(msg.topic), backoff)
            if succeeded:
                # The rows are locked FOR UPDATE and their tokens checked above.
                _mark_succeeded(conn, succeeded, now, trace.line(now, "SUCCESS", consumer=consumer, broker=broker))
            return outcomes

        return self._tx(work)

    def _fail_one(self, conn: Connection, msg: StoredMessage, error: str, now: datetime, consumer: str,
                  broker: str, settings: TopicSettings, backoff: Backoff) -> None:
        values: dict[Any, Any] = {"update_time": now, "version": m.c.version + 1}
        if msg.retry_remaining > 0:
            delay = backoff(msg, settings)
            values.update(status="NEW", effect_time=clock.after(now, delay), retry_remaining=msg.retry_remaining - 1,
                          lease_token=None, lease_expire=None)
            line = trace.line(now, "RETRY", consumer=consumer, broker=broker, attempt=msg.attempt,
                              next_in=f"{delay:.3f}s", retries_left=msg.retry_remaining - 1, error=error or "failed")
        else:
            values.update(status="FAIL", finish_time=now, lease_expire=None)
            line = trace.line(now, "FAIL", consumer=consumer, broker=broker, attempt=msg.attempt, error=error or "failed")
        values["trace"] = m.c.trace + line
        conn.execute(update(m).where(m.c.id == msg.id, m.c.status == "RUNNING").values(values))

    def release(self, lease_token: str, now: datetime, trace_line: str) -> int:
        def work(conn: Connection) -> int:
            # No index leads with lease_token: the RUNNING rows of each topic (those in flight)
            # are one range each of (topic, status, lease_expire), and the token picks among them.
            topics = self.topics_present(conn)
            if not topics:
                return 0
            return conn.execute(
                update(m)
                .where(m.c.topic.in_(topics), m.c.status == "RUNNING", m.c.lease_token == lease_token)
                .values(status="NEW", lease_token=None, lease_expire=None, attempt=m.c.attempt - 1,
                        update_time=now, version=m.c.version + 1, trace=m.c.trace + trace_line)
            ).rowcount

        return self._tx(work)

    def touch(self, id: int, lease_token: str, ttr: int, now: datetime) -> bool:
        stmt = (
            update(m)
            .where(m.c.id == id, m.c.status == "RUNNING", m.c.lease_token == lease_token)
            .values(lease_expire=clock.after(now, ttr), ttr=ttr, update_time=now)
        )
        return self._tx(lambda conn: conn.execute(stmt).rowcount == 1)


def _mark_succeeded(conn: Connection, ids: Sequence[int], now: datetime, line: str, *guard: Any) -> int:
    """Mark RUNNING messages ``ids`` SUCCESS (and ``guard`` conditions); return how many."""
    done = 0
    for start in range(0, len(ids), _CHUNK):
        done += conn.execute(
            update(m)
            .where(ids_in(ids[start : start + _CHUNK]), m.c.status == "RUNNING", *guard)
            .values(status="SUCCESS", finish_time=now, update_time=now, version=m.c.version + 1,
                    lease_expire=None, trace=m.c.trace + line)
        ).rowcount
    return done
