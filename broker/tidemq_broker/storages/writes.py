"""Produce and the operators' changes: insert, cancel, requeue, edit, delete, retention, and
the cancel requests of running messages and the result retention.

Each operation applies one lifecycle transition (``tidemq.lifecycle``) to the rows it selects.
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional, Sequence

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.exc import IntegrityError

from tidemq import clock, lifecycle
from tidemq import dependencies as deps
from tidemq.lifecycle import Event

from ..records import HandOff, MessageEdit, NewRow, RequestRef, StoredMessage, add_released
from ..schema import message as m
from ..schema import produce_request as r
from .changes import apply, guard
from .claims import hand_off
from .ids import ids_in
from .database import NoConnectionError, SqlDatabase
from .dependencies import has_dependents, release_after, stop_after
from .workflow_tally import Tally
from .workflows import settle
from .request_ids import Claims, answer, id_list
from .rows import edit_change, insert_columns, row_values, to_message

__all__ = ["Writes"]

_CHUNK = 1000  # ids per IN (...) list and rows per batch
_CANCELLED = lifecycle.CANCELLED.value
_UNRUN = (lifecycle.NEW.value, lifecycle.WAITING.value)
_FINAL = frozenset(status.value for status in lifecycle.FINAL_STATUSES)


class Writes:
    """Inserts and the transitions operators and producers start."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def insert_messages(self, rows: Sequence[NewRow], now: datetime, requests: Sequence[RequestRef] = (),
                        handoff: Optional[HandOff] = None, **who: object) -> list[int]:
        change = lifecycle.produce(now, **who)
        columns = insert_columns(change)
        dialect = self._db.dialect

        def work(conn: Connection, look_first: bool) -> list[int]:
            if handoff is not None:
                handoff.begin()
            ids: list[int] = [0] * len(rows)
            claims = Claims.of(requests, _stored_answers(conn, requests) if look_first else {})
            for ref, found in claims.answered.items():
                ids[ref.start : ref.start + ref.count] = found
            skip = claims.skipped()
            plain = [i for i, r in enumerate(rows) if not r.unique_key and i not in skip]
            keyed = [i for i, r in enumerate(rows) if r.unique_key and i not in skip]
            plain_values = [row_values(rows[i], columns) for i in plain]
            ours = sorted(claims.ours, key=lambda ref: ref.request_id)  # one key order between brokers
            if ours and len(plain) == len(rows):
                # Every row is new and plain: the dialect may write the rows and their request
                # ids in one round trip.
                answers = [(ref.request_id, ref.start, ref.count) for ref in ours]
                done = dialect.insert_plain_answering(conn, plain_values, answers, now)
                if done is not None:
                    if handoff is not None:
                        _hand_off_inserted(conn, handoff, rows, done, plain)
                    return done
            if plain:
                new_ids = dialect.insert_plain(conn, plain_values)
                for i, new_id in zip(plain, new_ids):
                    ids[i] = new_id
            if keyed:
                dialect.insert_ignoring_duplicates(conn, [row_values(rows[i], columns) for i in keyed])
                found = _ids_by_unique_key(conn, [(rows[i].topic, rows[i].unique_key or "") for i in keyed])
                for i in keyed:
                    ids[i] = found[(rows[i].topic, rows[i].unique_key or "")]
            for repeat, original in claims.repeats:
                ids[repeat.start : repeat.start + repeat.count] = ids[original.start : original.start + original.count]
            if ours:
                # A plain INSERT: a request id stored already (or by a transaction still open,
                # which it waits for) makes it fail, and the whole unit of work is redone below.
                conn.execute(insert(r), [{"request_id": ref.request_id, "created": now,
                                          "ids": id_list(ids[ref.start : ref.start + ref.count])}
                                         for ref in ours])
            if handoff is not None:
                _hand_off_inserted(conn, handoff, rows, ids, plain)  # keyed rows may be old ones
            return ids

        first_attempt = 0
        if handoff is None and not dialect.single_writer and not any(row.unique_key for row in rows):
            # No pull to lease to, no key to look up: the rows' INSERT (with the calls' request
            # ids, in the same string) can be the whole transaction, committed in its round trip.
            try:
                alone = self._alone(rows, columns, requests, now)
            except IntegrityError:  # a request id stored already (rolled back with its connection)
                alone, first_attempt = None, 1  # a retry: look for its answer at once
            except NoConnectionError:
                # None of its kept connections free, and the server refused a new one (other
                # clients hold every connection it allows): nothing was sent, and the
                # transaction's pool may have one of its own free.
                alone = None
            if alone is not None:
                return alone
        # Retries are rare: the first attempt does not look for stored request ids (a round trip
        # saved on every produce). A duplicate key says this is a retry of a call committed
        # meanwhile: roll back, look first, and answer it from what is stored.
        for attempt in range(first_attempt, 3):
            try:
                return self._db.tx(lambda conn: work(conn, look_first=attempt > 0), produce=True,
                                   committed=handoff.committed if handoff is not None else None)
            except IntegrityError:
                if not requests or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _alone(self, rows: Sequence[NewRow], columns: Sequence[str], requests: Sequence[RequestRef],
               now: datetime) -> Optional[list[int]]:
        """Plain rows and their request ids committed in one round trip (``SqlDatabase.commit_alone``),
        or None: the dialect cannot here (several statements' worth of rows, lock mode 2), a
        request repeats within the group, or the connection was lost during the string. A
        request id stored already (a retry) raises IntegrityError, with nothing committed."""
        dialect = self._db.dialect
        if not dialect.commits_alone(answering=bool(requests)):
            return None
        claims = Claims.of(requests, {})
        if claims.repeats:
            return None
        values = [row_values(row, columns) for row in rows]
        if not requests:
            return self._db.commit_alone(lambda conn: dialect.insert_plain_alone(conn, values))
        answers = [(ref.request_id, ref.start, ref.count) for ref in sorted(claims.ours, key=lambda r: r.request_id)]
        # A connection lost during the string leaves its outcome to the transaction: its INSERT of
        # the same request ids fails if the string committed (or waits for it to end), and the
        # stored answer is read; if it did not, the rows are inserted there.
        return self._db.commit_alone(
            lambda conn: dialect.insert_plain_answering(conn, values, answers, now, commit=True), lost=lambda: None)

    def delete_produce_requests(self, before: datetime, limit: int) -> int:
        def work(conn: Connection) -> int:
            old = list(conn.execute(select(r.c.request_id).where(r.c.created < before).limit(limit)).scalars())
            return conn.execute(delete(r).where(r.c.request_id.in_(old))).rowcount if old else 0

        return self._db.tx(work)

    def cancel(self, ids: Sequence[int], released: Optional[dict[str, dict[int, int]]] = None,
               running_at: Optional[datetime] = None, topics: Optional[set[str]] = None,
               **who: object) -> list[bool]:
        change = lifecycle.cancel()
        marking = lifecycle.request_cancel(running_at, **who) if running_at is not None else None
        finished: dict[int, str] = {}
        freed: dict[int, tuple[str, int]] = {}
        held: dict[int, str] = {}

        def work(conn: Connection) -> list[bool]:
            finished.clear()
            freed.clear()
            held.clear()
            wanted = sorted(set(ids))
            which = guard(change) if marking is None else guard(change) | guard(marking)
            # One locking read finds both kinds, so a running cancel costs one transaction.
            found = conn.execute(select(m.c.id, m.c.workflow_id, m.c.status, m.c.topic)
                                 .where(ids_in(wanted), which).with_for_update()).all()
            pending = {row.id: row.workflow_id for row in found if change.allows({"status": row.status})}
            if pending:
                apply(conn, change, ids_in(sorted(pending)))
            if marking is not None:
                held.update((row.id, row.topic) for row in found if marking.allows({"status": row.status}))
            if held:
                # Once each: a repeated request adds no trace line.
                apply(conn, marking, ids_in(sorted(held)), ~m.c.cancel_requested)
            # A message waited on is gone: what waits on it would otherwise wait for ever.
            waited = {id: workflow_id for id, workflow_id in pending.items() if workflow_id is not None}
            if waited:
                freed.update(_ended(conn, waited, finished))
            return [i in pending or i in held for i in ids]

        cancelled = self._db.tx(work) if ids else []
        self._db.workflow_outcomes.ended(finished)
        add_released(released, freed)
        if topics is not None:
            topics.update(held.values())
        return cancelled

    def requeue(self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime,
                event: Event = Event.REQUEUED, topics: Optional[set[str]] = None, **who: object) -> int:
        change = lifecycle.requeue(now, retry, event, **who)
        moved = 0
        while True:
            found: set[str] = set()

            def work(conn: Connection) -> int:
                found.clear()
                stmt = select(m.c.id, m.c.topic).where(guard(change))
                stmt = stmt.where(m.c.id.in_(list(ids))) if ids else stmt.where(m.c.topic == topic)
                chunk = conn.execute(stmt.order_by(m.c.id).limit(_CHUNK)).all()
                found.update(row.topic for row in chunk)
                return apply(conn, change, m.c.id.in_([row.id for row in chunk])) if chunk else 0

            done = self._db.tx(work)
            if done and topics is not None:
                topics.update(found)
            moved += done
            if done == 0 or ids:
                return moved

    def edit_message(self, id: int, version: int, edit: MessageEdit, now: datetime, user: str, changed: Sequence[str],
                     released: Optional[dict[str, dict[int, int]]] = None) -> Optional[StoredMessage]:
        change = edit_change(edit, now, user, changed)
        finished: dict[int, str] = {}
        freed: dict[int, tuple[str, int]] = {}

        def work(conn: Connection) -> Optional[StoredMessage]:
            finished.clear()
            freed.clear()
            before = conn.execute(select(m.c.status, m.c.workflow_id).where(m.c.id == id, m.c.version == version)
                                  .with_for_update()).one_or_none()
            if before is None:
                return None
            ends = deps.edited(id, before.status, edit.status,
                               before.workflow_id is not None and has_dependents(conn, id))
            if apply(conn, change, m.c.id == id, m.c.version == version) != 1:
                return None
            tally = Tally()
            if before.workflow_id is not None and before.status in _UNRUN and edit.status in _FINAL:
                tally.end(before.workflow_id, edit.status)  # a step ended by hand
            if ends is lifecycle.SUCCESS:
                freed.update(release_after(conn, [id], now, "", tally))
            elif ends is not None:
                freed.update(stop_after(conn, {id: ends.value}, now, "", tally))
            if tally:
                finished.update(settle(conn, tally, now))
            return to_message(conn.execute(select(m).where(m.c.id == id)).one()._mapping)

        edited = self._db.tx(work)
        self._db.workflow_outcomes.ended(finished)
        add_released(released, freed)
        return edited

    def delete_messages(self, ids: Sequence[int], released: Optional[dict[str, dict[int, int]]] = None) -> int:
        change = lifecycle.admin_delete()
        wanted = sorted(set(ids))
        finished: dict[int, str] = {}
        freed: dict[int, tuple[str, int]] = {}

        def work(conn: Connection) -> int:
            finished.clear()
            freed.clear()
            deleted, waited = 0, {}
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start : start + _CHUNK]
                # Messages not run yet that others wait on: those would otherwise wait for ever.
                waited.update((row.id, row.workflow_id) for row in conn.execute(
                    select(m.c.id, m.c.workflow_id).where(m.c.id.in_(chunk), m.c.workflow_id.is_not(None),
                                                          m.c.status.in_(_UNRUN)).with_for_update()))
                deleted += apply(conn, change, m.c.id.in_(chunk))
            if waited:
                freed.update(_ended(conn, waited, finished))
            return deleted

        deleted = self._db.tx(work)
        self._db.workflow_outcomes.ended(finished)
        add_released(released, freed)
        return deleted

    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        change = lifecycle.retire()

        def work(conn: Connection) -> int:
            old = list(conn.execute(
                select(m.c.id).where(m.c.topic == topic, guard(change), m.c.finish_time < before).limit(limit)
            ).scalars())
            return apply(conn, change, m.c.id.in_(old)) if old else 0

        return self._db.tx(work)

    def forget_results(self, topic: str, before: datetime, limit: int) -> int:
        change = lifecycle.forget_result(before)
        old = [m.c.topic == topic, guard(change), m.c.finish_time < before,
               (m.c.result.is_not(None)) | (m.c.progress.is_not(None))]

        def work(conn: Connection) -> int:
            # A non-locking read finds them; the update locks them by key.
            found = list(conn.execute(select(m.c.id).where(*old).limit(limit)).scalars())
            return apply(conn, change, ids_in(found), m.c.finish_time < before) if found else 0

        return self._db.tx(work)


def _stored_answers(conn: Connection, requests: Sequence[RequestRef]) -> dict[str, list[int]]:
    """The ids each already stored request id was answered."""
    names = sorted({ref.request_id for ref in requests})
    found = conn.execute(select(r.c.request_id, r.c.ids).where(r.c.request_id.in_(names))).all()
    return {name: answer(ids) for name, ids in found}


def _ids_by_unique_key(conn: Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    by_topic: dict[str, set[str]] = {}
    for topic_name, key in keys:
        by_topic.setdefault(topic_name, set()).add(key)
    for topic_name, key_set in by_topic.items():
        key_list = sorted(key_set)
        for start in range(0, len(key_list), _CHUNK):
            chunk = key_list[start : start + _CHUNK]
            # Read from the unique index alone: (unique_key, keyed_topic), the id with them.
            stmt = select(m.c.id, m.c.unique_key).where(m.c.keyed_topic == topic_name, m.c.unique_key.in_(chunk))
            for row in conn.execute(stmt):
                found[(topic_name, row.unique_key)] = row.id
    return found


def _ended(conn: Connection, gone: dict[int, int], finished: dict[int, str]) -> dict[int, tuple[str, int]]:
    """Messages of workflows ({id: workflow id}) removed before they ran: what waits on them
    learns they ended CANCELLED, and their workflows count them ended, failed. Returns {id:
    (topic, priority)} of the steps this released (those waiting for their dependencies to end,
    whatever the outcome)."""
    now = clock.now()
    tally = Tally()
    tally.end_many((workflow_id, _CANCELLED) for workflow_id in gone.values())
    released = stop_after(conn, {id: _CANCELLED for id in gone}, now, "", tally)
    finished.update(settle(conn, tally, now))
    return released


def _hand_off_inserted(conn: Connection, handoff: HandOff, rows: Sequence[NewRow], ids: Sequence[int],
                       new: Sequence[int]) -> None:
    """Offer the rows at positions ``new``, just inserted with ``ids``, to the pulls waiting for
    them (``claims.hand_off``: {topic: [(id, priority, effect_time)]}, and each row by its id,
    which a pull that takes it leases without reading it back)."""
    due: dict[str, list[tuple[int, int, datetime]]] = {}
    inserted: dict[int, NewRow] = {}
    for i in new:
        row = rows[i]
        due.setdefault(row.topic, []).append((ids[i], row.priority, row.effect_time))
        inserted[ids[i]] = row
    hand_off(conn, handoff, due, inserted=inserted)
