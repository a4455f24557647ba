"""tidemq for asyncio: ``await produce(...)`` and friends over grpc.aio.

>>> import tidemq.aio
>>> msg_id = await tidemq.aio.produce("order.close", {"order_id": 42}, delay=1800)   # doctest: +SKIP

The functions use one :class:`AsyncClient` per event loop, made on first use from the
environment (or from :func:`configure`); ``await tidemq.aio.close()`` closes the current loop's.
Input checks, errors, discovery and failover are the synchronous client's. The shapes (``sig``,
``chain``, ``group``, ``chord``, ``batch``) are the package's: ``await shape.produce(client())``
submits one through an AsyncClient. Async handlers need nothing from here: ``@mq_consumer`` on
an ``async def`` is enough (see ``tidemq.aio.handlers``).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from datetime import datetime
from typing import Any, Iterable, Optional, Sequence

from ..config import Settings
from ..rpc_build import Retry
from ..workflow_handles import AsyncWorkflowHandle
from ..workflow_info import WorkflowInfo
from ..workflows import Workflow
from .batch import BatchConsumer
# After the submodule tidemq.aio.batch (the BatchConsumer), whose import set this name to itself.
from ..canvas import batch, chain, chord, group, sig  # noqa: E402
from .client import AsyncClient
from .handles import AsyncHandle

__all__ = ["AsyncClient", "AsyncHandle", "BatchConsumer", "configure", "client", "close", "produce", "produce_many",
           "submit", "cancel", "cancel_workflow", "requeue", "handle", "workflow_state", "workflow_handle",
           "AsyncWorkflowHandle", "WorkflowInfo", "Workflow", "sig", "chain", "group", "chord", "batch"]

_lock = threading.Lock()
_settings: Optional[Settings] = None
_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]" = weakref.WeakKeyDictionary()


def configure(*, zk_hosts: Optional[str] = None, zk_root: Optional[str] = None,
              brokers: Optional[str | Sequence[str]] = None, **settings: Any) -> Settings:
    """Settings for the default clients made from now on; arguments override TIDEMQ_* variables."""
    global _settings
    if isinstance(brokers, (list, tuple)):
        brokers = ",".join(brokers)
    new = Settings.from_env(zk_hosts=zk_hosts, zk_root=zk_root, brokers=brokers, **settings)
    with _lock:
        _settings = new
    return new


def client() -> AsyncClient:
    """The running event loop's default client (made on first use)."""
    loop = asyncio.get_running_loop()
    with _lock:
        made = _clients.get(loop)
        if made is None:
            made = _clients[loop] = AsyncClient(_settings)
        return made


async def close() -> None:
    """Close the running loop's default client, if it has one."""
    with _lock:
        made = _clients.pop(asyncio.get_running_loop(), None)
    if made is not None:
        await made.close()


async def produce(topic: str, data: Any = None, *, delay: Optional[float] = None,
                  effect_time: Optional[datetime] = None, retry: Retry = None, unique_key: Optional[str] = None,
                  timeout: Optional[float] = None, key: Optional[str] = None, priority: int = 0,
                  result: bool = False, depends_on: Optional[Iterable[Any]] = None) -> Any:
    """Store one message; returns its id after the commit (with ``result``: an AsyncHandle;
    ``depends_on``: ids or handles it waits on). See :meth:`tidemq.Client.produce`."""
    return await client().produce(topic, data, delay=delay, effect_time=effect_time, retry=retry,
                                  unique_key=unique_key, timeout=timeout, key=key, priority=priority, result=result,
                                  depends_on=depends_on)


async def produce_many(topic: str, datas: Iterable[Any], *, delay: Optional[float] = None,
                       effect_time: Optional[datetime] = None, retry: Retry = None,
                       unique_keys: Optional[Sequence[Optional[str]]] = None,
                       timeout: Optional[float] = None, keys: Optional[Sequence[Optional[str]]] = None,
                       priority: int = 0, result: bool = False,
                       depends_on: Optional[Iterable[Any]] = None) -> list[Any]:
    """Store many messages in one transaction (all or none); ids, or AsyncHandles with ``result``.
    See :meth:`tidemq.Client.produce_many`."""
    return await client().produce_many(topic, datas, delay=delay, effect_time=effect_time, retry=retry,
                                       unique_keys=unique_keys, timeout=timeout, keys=keys, priority=priority,
                                       result=result, depends_on=depends_on)


async def submit(workflow: Workflow, timeout: Optional[float] = None, result: bool = False) -> list[Any]:
    """Store every step of ``workflow`` in one transaction; their ids (or AsyncHandles with
    ``result``) in the order they were added. See :meth:`tidemq.Client.submit`."""
    return await client().submit(workflow, timeout=timeout, result=result)


async def cancel(msg_id: int, running: bool = False) -> bool:
    """Delete a pending message; True if it was NEW and is now gone (``running``: or a RUNNING
    one was marked: its handler stops, it ends CANCELLED)."""
    return await client().cancel(msg_id, running=running)


async def cancel_workflow(workflow: Any, running: bool = False) -> int:
    """Cancel a workflow whole; how many steps were removed or marked. See
    :meth:`tidemq.Client.cancel_workflow`."""
    return await client().cancel_workflow(workflow, running=running)


async def workflow_state(workflow: Any, wait: Optional[float] = 0.0) -> WorkflowInfo:
    """A workflow's row; ``wait`` > 0: once it ended, or after ``wait`` seconds. See
    :meth:`tidemq.Client.workflow_state`."""
    return await client().workflow_state(workflow, wait=wait)


def workflow_handle(workflow: Any) -> AsyncWorkflowHandle:
    """A handle on a workflow for the running loop's client; ``await`` it to wait for its end."""
    return client().workflow_handle(workflow)


def handle(msg_id: int) -> AsyncHandle:
    """A handle on message ``msg_id`` for the running loop's client; ``await`` it for the result."""
    return client().handle(msg_id)


async def requeue(ids: Optional[Sequence[int]] = None, *, topic: Optional[str] = None, retry: int = 0) -> int:
    """Put FAIL messages back to NEW (by id, or all of a topic); returns how many."""
    return await client().requeue(ids, topic=topic, retry=retry)
