"""Statements that must not wait for a row lock: they fail at once instead.

InnoDB has ``SKIP LOCKED`` and ``NOWAIT`` for locking reads only. An ``UPDATE`` that meets a row
another transaction holds waits for it, up to ``innodb_lock_wait_timeout`` (50 s by default),
and an application transaction that called ``tidemq.enqueue`` can hold a row that long. MariaDB
sets a variable for one statement (``SET STATEMENT ... FOR``), and 0 is a valid lock wait
timeout there: such a statement fails at once with error 1205 and changes nothing, and its
caller takes the path that skips locked rows instead (``claims.lease_no_wait``).

A statement asks for it with the execution option :data:`NO_WAIT`; the engine's
``before_cursor_execute`` hook (:func:`enable`) adds the prefix. MySQL's lock wait timeout is 1 s
at least, and SQLite has no row locks: neither offers it (``SqlDialect.no_wait``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event

__all__ = ["NO_WAIT", "enable"]

#: The execution option of a statement that must fail instead of waiting for a row lock.
NO_WAIT = "tidemq_no_wait"
_PREFIX = "SET STATEMENT innodb_lock_wait_timeout=0 FOR "


def enable(engine: Engine) -> None:
    """Let the statements of ``engine`` ask for :data:`NO_WAIT`."""
    event.listen(engine, "before_cursor_execute", _prefixed, retval=True)


def _prefixed(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
              executemany: bool) -> tuple[str, Any]:
    if context is not None and context.execution_options.get(NO_WAIT):
        return _PREFIX + statement, parameters
    return statement, parameters
