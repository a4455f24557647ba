"""``tidemq.enqueue``: store a message in the application's own database transaction.

Writing to the database is the broker package's job (all SQL lives in its storage layer), and
the client package never imports the broker package (``tests/unit/test_import_direction.py``).
Transactional enqueue is the one call of the client surface that needs the database instead of
a broker, so this module forwards it, by name, to ``tidemq_broker.enqueue``: an application
using it installs ``tidemq[broker]`` (SQLAlchemy and PyMySQL, which it has anyway to hold a
transaction on the same database). This forwarding is the single, tested exception to the
direction of imports.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any, Callable, Optional

from .errors import ConfigurationError

__all__ = ["enqueue", "IMPLEMENTATION"]

#: The module that implements enqueue, imported on first use.
IMPLEMENTATION = "tidemq_broker.enqueue"
_impl: Optional[Callable[..., int]] = None


def enqueue(connection: Any, topic: str, data: Any = None, *, delay: Optional[float] = None,
            effect_time: Optional[datetime] = None, retry: Any = None, unique_key: Optional[str] = None,
            key: Optional[str] = None, priority: int = 0) -> int:
    """Store one message in the caller's open transaction; return its id.

    ``connection``: a SQLAlchemy ``Connection`` or ``Session``, or a PyMySQL connection, on the
    database that holds tidemq's tables, with the application's transaction open. The message
    exists if and only if that transaction commits. ``delay``, ``effect_time``, ``retry``,
    ``unique_key``, ``key`` and ``priority`` are checked and applied as by :func:`tidemq.produce`.
    """
    return _implementation()(connection, topic, data, delay=delay, effect_time=effect_time, retry=retry,
                             unique_key=unique_key, key=key, priority=priority)


def _implementation() -> Callable[..., int]:
    global _impl
    if _impl is None:
        try:
            module = importlib.import_module(IMPLEMENTATION)
        except ImportError as exc:
            raise ConfigurationError(f"tidemq.enqueue writes to the database itself and needs the broker extra: "
                                     f"pip install 'tidemq[broker]' ({exc})") from None
        _impl = module.enqueue
    return _impl
