"""Message lookups of the SQL storage, and the topics present in the message table."""

from __future__ import annotations

from typing import Optional, Sequence

from sqlalchemy import Connection, select

from tidemq.lifecycle import MessageStatus

from ..records import MessageResult, StoredMessage
from ..schema import message as m
from .database import SqlDatabase
from .ids import bound_ids_in
from .rows import to_message

__all__ = ["Reads", "topics_present", "any_running", "RESULT_COLUMNS"]

_CHUNK = 1000
#: What a MessageResult holds (also the console's retained results).
RESULT_COLUMNS = (m.c.id, m.c.topic, m.c.status, m.c.result, m.c.progress, m.c.effect_time, m.c.finish_time,
                  m.c.cancel_requested)
_RESULTS_OF = select(*RESULT_COLUMNS).where(bound_ids_in()).order_by(m.c.id)


def topics_present(conn: Connection) -> list[str]:
    """Every topic that has messages, from the message table itself (a topic row may be missing,
    and nothing stored may be left out): MySQL answers it by jumping from topic to topic along an
    index that starts with topic."""
    return list(conn.execute(select(m.c.topic).distinct()).scalars())


def any_running(conn: Connection, topic: str) -> bool:
    """Whether a message of ``topic`` is RUNNING (a serial topic's head is then busy)."""
    return conn.execute(select(m.c.id).where(m.c.topic == topic, m.c.status == MessageStatus.RUNNING.value)
                        .limit(1)).first() is not None


class Reads:
    """Messages by id, and the topics of messages or of a lease."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def get_message(self, id: int) -> Optional[StoredMessage]:
        row = self._db.tx(lambda conn: conn.execute(select(m).where(m.c.id == id)).first())
        return to_message(row._mapping) if row is not None else None

    def message_topics(self, ids: Sequence[int]) -> set[str]:
        wanted = sorted(set(ids))
        if not wanted:
            return set()
        return set(self._db.tx(lambda conn: conn.execute(
            select(m.c.topic).where(m.c.id.in_(wanted)).distinct()).scalars()))

    def lease_topics(self, lease_token: str) -> set[str]:
        def work(conn: Connection) -> set[str]:
            # As in Leases.release: no index leads with lease_token, the RUNNING rows of each
            # topic are one range of (topic, status, lease_expire).
            topics = topics_present(conn)
            if not topics:
                return set()
            return set(conn.execute(select(m.c.topic).where(
                m.c.topic.in_(topics), m.c.status == MessageStatus.RUNNING.value,
                m.c.lease_token == lease_token).distinct()).scalars())

        return self._db.tx(work)

    def get_results(self, ids: Sequence[int]) -> list[MessageResult]:
        wanted = sorted(set(ids))

        def work(conn: Connection) -> list[MessageResult]:
            found: list[MessageResult] = []
            for start in range(0, len(wanted), _CHUNK):
                rows = conn.execute(_RESULTS_OF, {"ids": wanted[start : start + _CHUNK]})
                found += [MessageResult(**row._mapping) for row in rows]
            return found

        # Waiting Results calls read again on every wake-up: no transaction, a statement built once.
        return self._db.read(work) if wanted else []
