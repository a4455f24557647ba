"""``tidemq.enqueue``: a message stored in the application's own database transaction.

The application passes the connection its transaction runs on: a SQLAlchemy ``Connection``, a
SQLAlchemy ORM ``Session`` (or ``scoped_session``), or a plain PyMySQL connection. The message is
inserted into tidemq's table on that connection and exists exactly when the application commits;
a rollback leaves nothing. Input is checked as ``produce`` checks it, before any statement runs,
so a refused call leaves the application's transaction as it was.

Brokers learn of a committed message through their pull hub's probe of recent inserts
(``tidemq_broker.pulls``): a waiting consumer gets it within about one probe interval (20 ms).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from tidemq import clock, tracing
from tidemq.client import Retry
from tidemq.config import Settings
from tidemq.validation import (
    check_data_size,
    check_delay,
    check_effect_time,
    check_flow_key,
    check_priority,
    check_topic,
    check_unique_key,
    encode_data,
    parse_retry,
)

from .errors import ConfigurationError, InvalidDelayError
from .new_row import due_at, new_row
from .storage import TopicSettings
from .storages.enqueue import CallerTransaction, DbApiTransaction, SqlAlchemyTransaction, insert_message, topic_settings

__all__ = ["enqueue"]

#: The column's limit: no topic setting or environment makes data larger than this fit.
_MAX_COLUMN_BYTES = 16 * 1024 * 1024 - 1


def enqueue(connection: Any, topic: str, data: Any = None, *, delay: Optional[float] = None,
            effect_time: Optional[datetime] = None, retry: Retry = None, unique_key: Optional[str] = None,
            key: Optional[str] = None, priority: int = 0) -> int:
    """Store one message in the caller's open transaction and return its id.

    ``connection`` is a SQLAlchemy ``Connection`` or ``Session``, or a PyMySQL connection, to the
    database that holds tidemq's tables. Nothing is committed here: the message exists once the
    caller commits, and a rollback leaves nothing. ``delay``, ``effect_time``, ``retry`` and
    ``unique_key``, ``key`` (the per-key running limit's key) and ``priority`` mean what they
    mean for ``produce``; a unique key stored before (or by a
    transaction that commits while this one waits on the key) returns that message's id.
    """
    topic = check_topic(topic)
    if delay is not None and effect_time is not None:
        raise InvalidDelayError("give delay or effect_time, not both")
    delay = check_delay(delay) if delay is not None else None
    when = check_effect_time(effect_time) if effect_time is not None else None
    count, schedule = parse_retry(retry)
    unique = check_unique_key(unique_key) or None
    flow_key = check_flow_key(key) or None
    priority = check_priority(priority)
    text = encode_data(data, _MAX_COLUMN_BYTES)
    tx = _transaction(connection)
    settings = topic_settings(tx, topic)
    check_data_size(text, (settings.max_data_bytes if settings else None) or _default_max_data_bytes())
    now = clock.now()
    due = due_at(now, delay, int(when.timestamp() * 1000) if when is not None else None)
    with tracing.produce_span(topic, 1) as span:
        row = new_row(topic, text, settings or TopicSettings(topic), due, retry=count, retry_schedule=schedule,
                      unique_key=unique, priority=priority, flow_key=flow_key,
                      trace_context=tracing.current_traceparent() or None)
        message_id = insert_message(tx, row, now, via="enqueue")
        tracing.set_message_ids(span, [message_id])
    return message_id


def _transaction(connection: Any) -> CallerTransaction:
    """The caller's open transaction behind ``connection``, whichever kind it is."""
    if isinstance(connection, Connection):
        return SqlAlchemyTransaction(connection)
    if isinstance(connection, (Session, scoped_session)):
        # The Connection the session's transaction runs on (begun now if it was not yet).
        return SqlAlchemyTransaction(connection.connection())
    if isinstance(connection, Engine):
        raise ConfigurationError("enqueue needs the connection of an open transaction, not an Engine: "
                                 "with engine.begin() as conn: tidemq.enqueue(conn, ...)")
    if callable(getattr(connection, "cursor", None)):
        _check_in_transaction(connection)
        return DbApiTransaction(connection)
    raise ConfigurationError("enqueue takes a SQLAlchemy Connection or Session, or a PyMySQL connection; "
                             f"got {type(connection).__name__}")


def _check_in_transaction(connection: Any) -> None:
    """An autocommitting PyMySQL connection would commit the message on its own, at once."""
    get_autocommit = getattr(connection, "get_autocommit", None)
    status = getattr(connection, "server_status", None)
    if get_autocommit is None or status is None:
        return
    from pymysql.constants import SERVER_STATUS  # the DB-API path is PyMySQL's

    if get_autocommit() and not status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
        raise ConfigurationError("the PyMySQL connection is in autocommit mode with no transaction open: "
                                 "call connection.begin() first (or connect with autocommit=False)")


@functools.cache
def _default_max_data_bytes() -> int:
    """TIDEMQ_MAX_DATA_BYTES, as the brokers read it, for topics without their own limit."""
    return Settings.from_env().max_data_bytes
