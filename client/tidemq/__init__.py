"""tidemq: durable, delay-precise messages on MySQL and ZooKeeper.

>>> import tidemq
>>> tidemq.configure(zk_hosts="127.0.0.1:2181")
>>> msg_id = tidemq.produce("order.close", {"order_id": 42}, delay=1800, retry=3)
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from .errors import *  # noqa: F401,F403  (the exception tree is part of the public surface)
from .errors import __all__ as _error_names

if TYPE_CHECKING:
    from .batch import AckResult, BatchConsumer
    from .client import Client, Retry
    from .config import Settings
    from .consumer import mq_consumer
    from .handles import Handle
    from .results import Progress
    from .message import Message, MessageStatus, MessageType
    from .transactional import enqueue
    from .worker import Worker
    from .workflows import Workflow
    from .workflow_handles import WorkflowHandle
    from .workflow_info import WorkflowInfo
    from .canvas import chain, chord, group, sig

#: Names this package exports from its modules, each imported on first use (PEP 562): the
#: broker, the console and the Spark jobs import ``tidemq.lifecycle`` or ``tidemq.tables``, which
#: runs this file first, and must not pay for (or need) grpc and the client to do so.
_LAZY = {
    "AckResult": "batch", "BatchConsumer": "batch", "Client": "client", "Retry": "client", "Settings": "config",
    "mq_consumer": "consumer", "Message": "message", "MessageStatus": "message", "MessageType": "message",
    "enqueue": "transactional", "Worker": "worker", "Handle": "handles", "Progress": "results",
    "Workflow": "workflows", "sig": "canvas", "chain": "canvas", "group": "canvas", "chord": "canvas",
    "WorkflowHandle": "workflow_handles", "WorkflowInfo": "workflow_info", "WorkflowState": "dependencies",
    "batch": "canvas",  # served by _Package.batch below: the name is also a submodule's
}

__all__ = [
    "configure",
    "produce",
    "produce_many",
    "submit",
    "Workflow",
    "sig",
    "chain",
    "group",
    "chord",
    "batch",
    "enqueue",
    "broadcast",
    "cancel",
    "cancel_workflow",
    "workflow_state",
    "workflow_handle",
    "WorkflowInfo",
    "WorkflowState",
    "WorkflowHandle",
    "requeue",
    "schedule",
    "handle",
    "Handle",
    "Progress",
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def configure(*, zk_hosts: Optional[str] = None, zk_root: Optional[str] = None,
              brokers: Optional[str | Sequence[str]] = None, client: Optional[Client] = None,
              **settings: Any) -> Client:
    """Set up the process-wide client; arguments override the TIDEMQ_* environment."""
    from .client import Client
    from .config import Settings

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
            from .client import Client

            _client = Client()
        return _client


def produce(topic: str, data: Any = None, *, delay: Optional[float] = None, effect_time: Optional[datetime] = None,
            retry: Retry = None, unique_key: Optional[str] = None, timeout: Optional[float] = None,
            key: Optional[str] = None, priority: int = 0, result: bool = False,
            depends_on: Optional[Iterable[Any]] = None) -> Any:
    """Store one message; returns its id after the commit (with ``result``: a Handle;
    ``depends_on``: ids or handles it waits on). See :meth:`Client.produce`."""
    return _default().produce(topic, data, delay=delay, effect_time=effect_time, retry=retry,
                              unique_key=unique_key, timeout=timeout, key=key, priority=priority, result=result,
                              depends_on=depends_on)


def submit(workflow: Workflow, timeout: Optional[float] = None, result: bool = False) -> list[Any]:
    """Store every step of ``workflow`` in one transaction; their ids (or Handles with
    ``result``) in the order they were added. See :meth:`Client.submit`."""
    return _default().submit(workflow, timeout=timeout, result=result)


def produce_many(topic: str, datas: Iterable[Any], *, delay: Optional[float] = None,
                 effect_time: Optional[datetime] = None, retry: Retry = None,
                 unique_keys: Optional[Sequence[Optional[str]]] = None, timeout: Optional[float] = None,
                 keys: Optional[Sequence[Optional[str]]] = None, priority: int = 0,
                 result: bool = False,
                 depends_on: Optional[Iterable[Any]] = None) -> list[Any]:
    """Store many messages in one transaction (all or none); ids, or Handles with ``result``.
    See :meth:`Client.produce_many`."""
    return _default().produce_many(topic, datas, delay=delay, effect_time=effect_time, retry=retry,
                                   unique_keys=unique_keys, timeout=timeout, keys=keys, priority=priority,
                                   result=result, depends_on=depends_on)


def broadcast(topic: str, data: Any = None) -> int:
    """Send to every TOPIC consumer online now. See :meth:`Client.broadcast`."""
    return _default().broadcast(topic, data)


def cancel(msg_id: int, running: bool = False) -> bool:
    """Delete a pending message; True if it was NEW and is now gone. ``running``: a RUNNING
    message is marked instead, its handler stops and it ends CANCELLED (True then too)."""
    return _default().cancel(msg_id, running=running)


def cancel_workflow(workflow: Any, running: bool = False) -> int:
    """Cancel a workflow whole: its NEW and WAITING steps are removed (and, with ``running``, its
    RUNNING ones marked); how many. See :meth:`Client.cancel_workflow`."""
    return _default().cancel_workflow(workflow, running=running)


def workflow_state(workflow: Any, wait: Optional[float] = 0.0) -> "WorkflowInfo":
    """A workflow's row (state, policy, steps total, left and failed, created and finished);
    ``wait`` > 0: once it ended, or after ``wait`` seconds (None: until it ends). See
    :meth:`Client.workflow_state`."""
    return _default().workflow_state(workflow, wait=wait)


def workflow_handle(workflow: Any) -> "WorkflowHandle":
    """A handle on a workflow: its state, waiting for its end, cancelling it."""
    return _default().workflow_handle(workflow)


def handle(msg_id: int) -> "Handle":
    """A handle on message ``msg_id``: its status, progress and result, and cancelling it."""
    return _default().handle(msg_id)


def requeue(ids: Optional[Sequence[int]] = None, *, topic: Optional[str] = None, retry: int = 0) -> int:
    """Put FAIL messages back to NEW (by id, or all of a topic); returns how many."""
    return _default().requeue(ids, topic=topic, retry=retry)


def schedule(name: str, topic: str, cron: str, data: Any = None, *, timezone: str = "UTC", missed: str = "once",
             retry: Optional[int] = None) -> bool:
    """Declare a periodic message (idempotent); True when new. See :meth:`Client.schedule`."""
    return _default().schedule(name, topic, cron, data, timezone=timezone, missed=missed, retry=retry)


class _Package(types.ModuleType):
    """This package, whose ``batch`` is the canvas's ``batch(...)`` although a submodule
    ``tidemq.batch`` (the BatchConsumer) has that name too: importing the submodule sets the
    package's attribute, which this setter ignores (the submodule stays in ``sys.modules``, where
    ``from tidemq.batch import ...`` finds it)."""

    @property
    def batch(self) -> Any:
        from .canvas import batch

        return batch

    @batch.setter
    def batch(self, value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package
