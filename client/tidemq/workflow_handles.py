"""A handle on one workflow: its state, waiting for its end, and cancelling it; and its form
for asyncio, whose methods are coroutines and which ``await`` waits on.

>>> wf = tidemq.workflow_handle(chain(sig("etl.fetch"), sig("etl.load")).produce())   # doctest: +SKIP
>>> wf.wait(timeout=60).state                                                          # doctest: +SKIP
<WorkflowState.SUCCEEDED: 'SUCCEEDED'>

Like a message's :class:`~tidemq.handles.Handle`, it holds only the workflow's id (the id of
its first step) and the client it calls, so ``workflow_handle(id)`` rebuilds one anywhere.
"""

from __future__ import annotations

from typing import Any, Generator, Optional, Protocol

from .errors import ResultTimeoutError
from .workflow_info import WorkflowInfo

__all__ = ["WorkflowHandle", "AsyncWorkflowHandle"]


class WorkflowSource(Protocol):
    """What a workflow handle calls: a :class:`tidemq.Client`."""

    def workflow_state(self, workflow: Any, wait: Optional[float] = 0.0,
                       timeout: Optional[float] = None) -> WorkflowInfo:
        ...

    def cancel_workflow(self, workflow: Any, timeout: Optional[float] = None, *, running: bool = False) -> int:
        ...


def _ended(info: WorkflowInfo, timeout: Optional[float]) -> WorkflowInfo:
    if not info.finished:
        raise ResultTimeoutError(f"workflow {info.id} has not ended after {timeout} s ({info.state.value}, "
                                 f"{info.steps_left} of {info.steps_total} steps left)")
    return info


class WorkflowHandle:
    """One workflow, by id, and the client that reads it."""

    __slots__ = ("id", "_source")

    def __init__(self, id: int, source: WorkflowSource) -> None:
        self.id = int(id)
        self._source = source

    def __repr__(self) -> str:
        return f"WorkflowHandle({self.id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("workflow", self.id))

    def state(self) -> WorkflowInfo:
        """The workflow's row now; MessageNotFoundError for an unknown id."""
        return self._source.workflow_state(self.id)

    def wait(self, timeout: Optional[float] = None) -> WorkflowInfo:
        """Wait for the workflow to end (``timeout`` seconds; None: as long as it takes) and
        return its row; ResultTimeoutError when a step of it is left then."""
        return _ended(self._source.workflow_state(self.id, wait=timeout), timeout)

    def cancel(self, running: bool = False) -> int:
        """Cancel the workflow whole (see :meth:`tidemq.Client.cancel_workflow`); how many steps
        were removed or marked."""
        return self._source.cancel_workflow(self.id, running=running)


class AsyncWorkflowSource(Protocol):
    """What an async workflow handle calls: a :class:`tidemq.aio.AsyncClient`."""

    async def workflow_state(self, workflow: Any, wait: Optional[float] = 0.0,
                             timeout: Optional[float] = None) -> WorkflowInfo:
        ...

    async def cancel_workflow(self, workflow: Any, timeout: Optional[float] = None, *,
                              running: bool = False) -> int:
        ...


class AsyncWorkflowHandle:
    """:class:`WorkflowHandle` as coroutines; ``await handle`` is ``await handle.wait()``."""

    __slots__ = ("id", "_source")

    def __init__(self, id: int, source: AsyncWorkflowSource) -> None:
        self.id = int(id)
        self._source = source

    def __repr__(self) -> str:
        return f"AsyncWorkflowHandle({self.id})"

    def __await__(self) -> Generator[Any, None, WorkflowInfo]:
        return self.wait().__await__()

    async def state(self) -> WorkflowInfo:
        """As :meth:`WorkflowHandle.state`."""
        return await self._source.workflow_state(self.id)

    async def wait(self, timeout: Optional[float] = None) -> WorkflowInfo:
        """As :meth:`WorkflowHandle.wait`, without blocking the event loop."""
        return _ended(await self._source.workflow_state(self.id, wait=timeout), timeout)

    async def cancel(self, running: bool = False) -> int:
        """As :meth:`WorkflowHandle.cancel`."""
        return await self._source.cancel_workflow(self.id, running=running)
