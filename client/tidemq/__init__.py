"""tidemq: durable, delay-precise messages on MySQL and ZooKeeper.

>>> import tidemq
>>> tidemq.configure(zk_hosts="127.0.0.1:2181")
>>> msg_id = tidemq.produce("order.close", {"order_id": 42}, delay=1800, retry=3)
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Iterable, Optional, Sequence

from .batch import AckResult, BatchConsumer
from .client import Client, Retry
from .config import Settings
from .consumer import mq_consumer
from .transactional import enqueue
from .errors import *  # noqa: F401,F403  (the exception tree is part of the public surface)
from .errors import __all__ as _error_names
from .message import Message, MessageStatus, MessageType
from .worker import Worker

__all__ = [
    "configure",
    "produce",
    "produce_many",
    "enqueue",
    "broadcast",
    "cancel",
    "requeue",
    "schedule",
    "mq_consumer",
    "Message",
    "MessageType",
    "MessageStatus",
    "BatchConsumer",
    "AckResult",
    "Client",
    "Settings",
    "Worker",
    *_error_names,
]

_lock = threading.Lock()
_client: Optional[Client] = None


def configure(*, zk_hosts: Optional[str] = None, zk_root: Optional[str] = None,
              brokers: Optional[str | Sequence[str]] = None, client: Optional[Client] = None,
              **settings: Any) -> Client:
    """Set up the process-wide client; arguments override the TIDEMQ_* environment."""
    global _client
    if isinstance(brokers, (list, tuple)):
        brokers = ",".join(brokers)
    new = client or Client(Settings.from_env(zk_hosts=zk_hosts, zk_root=zk_root, brokers=brokers, **settings))
    with _lock:
        old, _client = _client, new
    if old is not None and old is not new:
        old.close()
    return new


def _default() -> Client:
    global _client
    with _lock:
        if _client is None:
            _client = Client()
        return _client


def produce(topic: str, data: Any = None, *, delay: Optional[float] = None, effect_time: Optional[datetime] = None,
            retry: Retry = None, unique_key: Optional[str] = None, timeout: Optional[float] = None,
            key: Optional[str] = None, priority: int = 0) -> int:
    """Store one message; returns its id after the commit. See :meth:`Client.produce`."""
    return _default().produce(topic, data, delay=delay, effect_time=effect_time, retry=retry,
                              unique_key=unique_key, timeout=timeout, key=key, priority=priority)


def produce_many(topic: str, datas: Iterable[Any], *, delay: Optional[float] = None,
                 effect_time: Optional[datetime] = None, retry: Retry = None,
                 unique_keys: Optional[Sequence[Optional[str]]] = None, timeout: Optional[float] = None,
                 keys: Optional[Sequence[Optional[str]]] = None, priority: int = 0) -> list[int]:
    """Store many messages in one transaction (all or none). See :meth:`Client.produce_many`."""
    return _default().produce_many(topic, datas, delay=delay, effect_time=effect_time, retry=retry,
                                   unique_keys=unique_keys, timeout=timeout, keys=keys, priority=priority)


def broadcast(topic: str, data: Any = None) -> int:
    """Send to every TOPIC consumer online now. See :meth:`Client.broadcast`."""
    return _default().broadcast(topic, data)


def cancel(msg_id: int) -> bool:
    """Delete a pending message; True if it was NEW and is now gone."""
    return _default().cancel(msg_id)


def requeue(ids: Optional[Sequence[int]] = None, *, topic: Optional[str] = None, retry: int = 0) -> int:
    """Put FAIL messages back to NEW (by id, or all of a topic); returns how many."""
    return _default().requeue(ids, topic=topic, retry=retry)


def schedule(name: str, topic: str, cron: str, data: Any = None, *, timezone: str = "UTC", missed: str = "once",
             retry: Optional[int] = None) -> bool:
    """Declare a periodic message (idempotent); True when new. See :meth:`Client.schedule`."""
    return _default().schedule(name, topic, cron, data, timezone=timezone, missed=missed, retry=retry)
