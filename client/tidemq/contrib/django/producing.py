"""Producing from Django: in the transaction of Django's own connection, or through brokers."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Callable, Optional

from django.db import connections, transaction

import tidemq
from tidemq.client import Client, Retry
from tidemq.errors import ConfigurationError

from . import conf

__all__ = ["enqueue", "produce", "send", "client"]

_lock = threading.Lock()
_client: Optional[Client] = None


def enqueue(topic: str, data: Any = None, *, using: Optional[str] = None, delay: Optional[float] = None,
            effect_time: Optional[datetime] = None, retry: Retry = None, unique_key: Optional[str] = None,
            key: Optional[str] = None, priority: int = 0) -> int:
    """Store a message in the current transaction of Django database ``using`` (default
    ``TIDEMQ['DATABASE']``, which must hold tidemq's tables); return its id.

    Inside ``transaction.atomic(using=...)`` the message exists if and only if that block
    commits. Outside one (Django's autocommit) it is stored at once, in a transaction of its own.
    Arguments are checked, and mean, as for :func:`tidemq.produce`; a refused call runs no
    statement and leaves the transaction usable. Statements go through Django's cursor, so they
    appear in ``connection.queries`` and pass through ``connection.execute_wrapper`` like the
    project's own, whichever driver the MySQL backend uses (mysqlclient, or PyMySQL installed as
    MySQLdb).
    """
    alias = using or conf.database_alias()
    if alias is None:
        raise ConfigurationError("tidemq.contrib.django.enqueue needs TIDEMQ['DATABASE']: the alias of the database "
                                 "that holds tidemq's tables (else use produce(), through brokers)")
    connection = connections[alias]
    if connection.vendor != "mysql":
        raise ConfigurationError(f"tidemq's tables live in MySQL/MariaDB; database {alias!r} is {connection.vendor}")
    call: Callable[[], int] = lambda: tidemq.enqueue(  # noqa: E731
        _DjangoCursors(connection), topic, data, delay=delay, effect_time=effect_time, retry=retry,
        unique_key=unique_key, key=key, priority=priority)
    if connection.in_atomic_block:
        return call()
    # savepoint=False: no savepoint round trips; this block is the transaction itself here.
    with transaction.atomic(using=alias, savepoint=False):
        return call()


class _DjangoCursors:
    """What ``tidemq.enqueue`` takes as a DB-API connection: its ``cursor()`` is Django's, on
    the connection (and so in the transaction) Django's ORM uses in this thread."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def cursor(self) -> Any:
        return self._connection.cursor()


def client() -> Client:
    """The process-wide :class:`tidemq.Client` made from ``settings.TIDEMQ`` on first use; it
    becomes tidemq's default client too, so ``tidemq.produce`` and ``tidemq.BatchConsumer`` use it."""
    global _client
    with _lock:
        if _client is None:
            _client = tidemq.configure(client=Client(conf.tidemq_settings()))
        return _client


def produce(topic: str, data: Any = None, **options: Any) -> int:
    """Produce through brokers, configured by ``settings.TIDEMQ``: :meth:`tidemq.Client.produce`.

    It returns once the message is committed by a broker, whatever the caller's transaction
    does afterwards: inside ``transaction.atomic()`` prefer :func:`enqueue` or :func:`send`."""
    return client().produce(topic, data, **options)


def send(topic: str, data: Any = None, *, using: str = "default", **options: Any) -> Optional[int]:
    """The message a view means to send when its transaction commits.

    With ``TIDEMQ['DATABASE']`` set this is :func:`enqueue` (in the transaction; returns the id).
    Otherwise it goes through brokers: at once outside an atomic block of database ``using``
    (returns the id), or from ``transaction.on_commit`` inside one (returns None; a rollback
    sends nothing). The on-commit path can lose a message whose process dies between the
    commit and the produce; enqueue cannot, which is why it is preferred when the tables allow.
    """
    if conf.database_alias() is not None:
        return enqueue(topic, data, **options)
    if connections[using].in_atomic_block:
        transaction.on_commit(lambda: produce(topic, data, **options), using=using)
        return None
    return produce(topic, data, **options)
