"""Acks: many outcomes in one transaction, each guarded by status RUNNING and its lease token,
so an outcome from a consumer that lost its lease is refused, never applied. A result is
written by the same statement as its status, and the steps waiting on a message are released
or stopped in the transaction that finishes it (``storages/dependencies.py``). A batch of plain
successes (no workflow) needs no transaction: its UPDATEs commit by themselves
(``Acks._plain_autocommit``)."""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Optional, Sequence

from sqlalchemy import Connection, select
from sqlalchemy.exc import DBAPIError

from tidemq import lifecycle
from tidemq.lifecycle import MessageStatus
from tidemq.link import AckItem, AckOutcome
from tidemq.tables import MESSAGE as M

from ..schema import message as m
from ..records import HandOff, TopicSettings, add_released
from .changes import apply, apply_each, apply_to_ids
from .claims import hand_off
from .database import SqlDatabase
from .dependencies import Released, release_after, stop_after
from .workflow_tally import Tally
from .workflows import settle
from .ids import bound_ids_in, ids_in
from .rows import sort_acks, to_message

__all__ = ["Acks"]

_CHUNK = 1000
_RUNNING = MessageStatus.RUNNING.value
#: The exact path's locking read, built once (the ids are bound at execution): only the tokens,
#: statuses and workflows are needed to judge the acks.
_LOCK_ACKED = select(m.c.id, m.c.lease_token, m.c.status, m.c.workflow_id).where(bound_ids_in()).with_for_update()


class _SomeStale(Exception):
    """Raised inside an ack's fast path to roll it back when an item's lease was lost."""


class Acks:
    """Outcomes: SUCCESS, a retry, or FAIL, as the lifecycle decides."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings], released: Optional[dict[str, dict[int, int]]] = None,
            handoff: Optional[HandOff] = None, committed: Optional[Callable[[], None]] = None) -> list[AckOutcome]:
        freed: dict[int, tuple[str, int]] = {}  # replaced whole by each run of the transaction
        finished: dict[int, str] = {}  # likewise: the workflows this ack ended
        # Successes the consumer did not mark as workflow steps take the fast path, and so do the
        # steps whose workflow it names (their UPDATE guarded by that id); steps marked without
        # an id go straight to the exact path, in the same transaction (trying them on the fast
        # path first cost every ack of a step a statement and a rollback).
        after = _in_turn(handoff.committed if handoff is not None else None, committed)
        plain = [item for item in items if not item.workflow]
        known = [item for item in items if item.workflow and item.workflow_id is not None]
        all_fast = (plain or known) and all(item.success and not item.cancelled for item in items) \
            and len({item.id for item in items}) == len(items)
        if all_fast and len(plain) == len(items) and not self._db.dialect.single_writer:
            # An item that did not match sends the batch to the exact path at once: the fast
            # path in a transaction would find the rows marked here and not match either.
            all_fast = False
            outcomes = self._db.autocommit(lambda conn: self._plain_autocommit(conn, items, now, consumer, broker))
            if outcomes is not None:
                if after is not None:
                    after()
                return outcomes
        if all_fast:
            steps = [item for item in items if item.workflow and item.workflow_id is None]

            def both(conn: Connection) -> list[AckOutcome]:
                fast = plain + known
                by_id = dict(zip((item.id for item in fast), self._all_succeeded(conn, fast, now, consumer, broker)))
                if steps or known:
                    by_id.update(zip((item.id for item in steps), self._each(
                        conn, steps, now, consumer, broker, topics, freed, finished, handoff, known)))
                return [by_id[item.id] for item in items]

            try:
                outcomes = self._db.tx(both, committed=after)
            except _SomeStale:  # rolled back: sort the batch out item by item below
                pass
            else:
                return self._ended(outcomes, freed, finished, released)
        outcomes = self._db.tx(lambda conn: self._each(conn, items, now, consumer, broker, topics, freed, finished,
                                                       handoff), committed=after)
        return self._ended(outcomes, freed, finished, released)

    def _ended(self, outcomes: list[AckOutcome], freed: dict[int, tuple[str, int]], finished: dict[int, str],
               released: Optional[dict[str, dict[int, int]]]) -> list[AckOutcome]:
        """After the commit: count the workflows that ended, and add the released steps to
        ``released`` ({topic: {id: priority}})."""
        self._db.workflow_outcomes.ended(finished)
        add_released(released, freed)
        return outcomes

    def _plain_autocommit(self, conn: Connection, items: Sequence[AckItem], now: datetime, consumer: str,
                          broker: str) -> Optional[list[AckOutcome]]:
        """The fast path of plain successes on an autocommit connection: each UPDATE commits by
        itself, a round trip instead of three (with the COMMIT and the rollback at check-in).
        Nothing else waits on a plain message, so nothing has to commit with it. None when an
        item did not match (or the server asked for a retry): the exact path then judges the
        batch, and answers a row an UPDATE here already marked SUCCESS under the item's token
        APPLIED, as it answers an ack sent twice; the same holds when this runs again after a
        lost connection."""
        try:
            return self._all_succeeded(conn, items, now, consumer, broker)
        except _SomeStale:
            return None
        except DBAPIError as exc:
            if self._db.dialect.is_transient(exc):  # a deadlock, a Galera certification conflict
                return None
            raise

    def _all_succeeded(self, conn: Connection, items: Sequence[AckItem], now: datetime, consumer: str,
                       broker: str) -> list[AckOutcome]:
        """The common case in one statement per lease token (and workflow) instead of a locking
        read first.

        A row is marked only while it is RUNNING under the very token the item names (tokens are
        per pulled batch) and outside any workflow, or, for a step whose workflow the consumer
        named (``AckItem.workflow_id``), in that workflow: the count of rows changed proves both.
        If any item does not match, the transaction is rolled back and the exact path decides
        each outcome. A message of a workflow may have steps waiting on it: guarding the UPDATE
        by the column spares every other ack a look for dependents, and the steps recorded here
        have theirs released by ``_each(known=...)`` in the same transaction.
        """
        groups: dict[tuple[str, Optional[int]], list[AckItem]] = {}
        for item in items:
            groups.setdefault((item.lease_token, item.workflow_id if item.workflow else None), []).append(item)
        success = lifecycle.succeed(now, consumer, broker)
        for (token, workflow_id), group in groups.items():
            guard: dict = {"no_workflow": True} if workflow_id is None else {"workflow_id": workflow_id}
            if all(item.result is None for item in group):
                ids = [item.id for item in group]
                changed = sum(apply_to_ids(conn, success, ids[start : start + _CHUNK], token, **guard)
                              for start in range(0, len(ids), _CHUNK))
            else:
                changed = apply_each(conn, success, [(item.id, {M.result: item.result}) for item in group],
                                     token, **guard)
            if changed != len(group):
                raise _SomeStale()
        return [AckOutcome.APPLIED] * len(items)

    def _each(self, conn: Connection, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
              topics: Callable[[str], TopicSettings], freed: dict[int, tuple[str, int]],
              finished: dict[int, str], handoff: Optional[HandOff] = None,
              known: Sequence[AckItem] = ()) -> list[AckOutcome]:
        """The exact path: each outcome of ``items`` judged on its row, read and locked first; and
        what every success and failure there and every step of ``known`` (successes already
        recorded by ``_all_succeeded``) releases or stops."""
        freed.clear()
        finished.clear()
        if handoff is not None:
            handoff.begin()
        ids = sorted({item.id for item in items})
        # Only the lease tokens are needed to judge the acks: reading (and decoding) whole rows
        # with their data and trace was most of an ack's cost. Failures, the rare case, read
        # their full row below for the retry decision.
        held: dict[int, str] = {}
        done: dict[int, tuple[str, str]] = {}  # finished rows: (status, the token they finished under)
        in_workflow: dict[int, int] = {}  # rows that may have steps waiting on them: their workflow
        for start in range(0, len(ids), _CHUNK):
            for row in conn.execute(_LOCK_ACKED, {"ids": ids[start : start + _CHUNK]}):
                if row.workflow_id is not None:
                    in_workflow[row.id] = row.workflow_id
                if row.status == _RUNNING:
                    held[row.id] = row.lease_token
                else:
                    done[row.id] = (row.status, row.lease_token)
        outcomes, succeeded, failed, cancelled = sort_acks(items, held, done)
        in_workflow.update((item.id, item.workflow_id) for item in known)  # type: ignore[misc]
        stopped = [item.id for item in cancelled]
        ended: dict[int, str] = {id: lifecycle.CANCELLED.value for id in stopped if id in in_workflow}
        if failed:
            rows = conn.execute(select(m).where(m.c.id.in_([item.id for item in failed])))
            full = {row.id: to_message(row._mapping) for row in rows}
            for item in failed:
                msg = full[item.id]
                change = lifecycle.fail_attempt(msg, topics(msg.topic), item.error, now, consumer, broker,
                                                result=item.result, cancel_requested=msg.cancel_requested)
                apply(conn, change, m.c.id == msg.id)
                if msg.id in in_workflow and change.target in (lifecycle.FAIL, lifecycle.CANCELLED):
                    ended[msg.id] = change.target.value
        if stopped:
            _chunked(conn, lifecycle.cancelled(now, consumer, broker), stopped)
        tally = Tally()
        due: dict[str, list[tuple[int, int, datetime]]] = {}  # released steps due now: for the hand-off
        read: dict[int, Released] = {}  # and what their delivery holds, as the release read it
        if succeeded or known:
            if succeeded:  # the rows are locked FOR UPDATE and their tokens checked above
                success = lifecycle.succeed(now, consumer, broker)
                apply_each(conn, success, [(item.id, {M.result: item.result}) for item in succeeded])
            done = [item.id for item in succeeded if item.id in in_workflow] + [item.id for item in known]
            tally.end_many((in_workflow[id], lifecycle.SUCCESS.value) for id in done)
            if handoff is None:
                freed.update(release_after(conn, done, now, broker, tally))
            else:  # the steps released due now are written by the hand-off, leased when a pull takes them
                freed.update(release_after(conn, done, now, broker, tally, due, read))
                hand_off(conn, handoff, due, read)
        if ended:
            tally.end_many((in_workflow[id], status) for id, status in ended.items())
            freed.update(stop_after(conn, ended, now, broker, tally))
        if tally:
            finished.update(settle(conn, tally, now))  # last: after every message row it locks
        return outcomes


def _chunked(conn: Connection, change: lifecycle.Change, ids: Sequence[int], *where: object) -> int:
    """Apply ``change`` to ``ids`` (and ``where``) a thousand ids per statement; return how many."""
    return sum(apply(conn, change, ids_in(ids[start : start + _CHUNK]), *where) for start in range(0, len(ids), _CHUNK))


def _in_turn(*calls: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    """One call that makes ``calls`` (None: none) in turn; None when there is none."""
    present = [call for call in calls if call is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def each() -> None:
        for call in present:
            call()

    return each
