"""The StubBroker's producing: produce, produce_many and submit. Messages produced with
``depends_on`` and workflows submitted whole wait (WAITING) until their dependencies succeed, as
the broker's storages do it
(``tidemq_broker.storages.dependencies``): the transitions of :mod:`tidemq.dependencies`, the
refusals before anything is stored (limits, positions, cycles, unknown ids, unique keys), the
release in the ack that records the last SUCCESS and the policy stop, transitively, when a
dependency ends FAIL or CANCELLED (or is cancelled while NEW). A pull hands each step out with
the ids of the messages it waited on, so ``message.inputs`` works on the stub.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from . import dependencies as deps
from . import lifecycle
from .clock import after
from .errors import DependencyCycleError, DependencyError, UnknownDependencyError, WorkflowTooLargeError, quote
from .handles import Handle
from .lifecycle import Change, MessageStatus
from .limits import MAX_DEPENDENCIES
from .rpc_build import dependency_ids
from .stub_types import StubTopic, stored_time
from .tables import MESSAGE as M
from .validation import (DEFAULT_MAX_DATA_BYTES, check_batch_size, check_flow_key, check_priority, check_topic,
                         check_unique_key, check_when, check_workflow_steps, encode_data, parse_retry)
from .stub_workflows import policy_of
from .workflows import Workflow

__all__ = ["StubProducing", "new_row"]

Row = dict[str, Any]
_SUCCESS, _WAITING = MessageStatus.SUCCESS.value, MessageStatus.WAITING.value
_ENDED = (MessageStatus.FAIL.value, MessageStatus.CANCELLED.value)


def new_row(msg_id: int, topic: str, text: str, due: datetime, retries: int, schedule: Optional[list[float]],
            unique: Optional[str], trace_context: str, priority: int, flow_key: Optional[str]) -> Row:
    """A new message's row before the produce change is applied to it."""
    return {M.id: msg_id, M.topic: topic, M.data: text, M.effect_time: due, M.order_time: due,
            M.retry_remaining: retries, M.retry_schedule: schedule, M.unique_key: unique,
            M.trace_context: trace_context or None, M.priority: priority, M.flow_key: flow_key, M.trace: ""}


class StubProducing:
    """Mixed into :class:`tidemq.stub.StubBroker`, which provides the state these calls use."""

    _cond: threading.Condition
    _rows: dict[int, Row]
    name: str

    def _now(self) -> datetime: ...  # provided by StubBroker
    def _new_id(self) -> int: ...
    def _apply(self, row: Row, change: Change, lease_token: Optional[str] = None) -> bool: ...
    def topic(self, topic: str) -> StubTopic: ...
    if TYPE_CHECKING:  # provided by StubWorkflows, later in StubBroker's bases: a body here would hide it
        def _new_workflow(self, ids: Sequence[int], waited: Sequence[int], policy: str, now: datetime) -> None: ...

    def _init_dependencies(self) -> None:
        self._parents: dict[int, tuple[int, ...]] = {}  # step -> the messages it waits on, ascending
        self._children: dict[int, set[int]] = {}

    def parents(self, msg_id: int) -> tuple[int, ...]:
        """The messages ``msg_id`` waited on, ascending ids (what its delivery names)."""
        with self._cond:
            return self._parents.get(msg_id, ())

    def produce(self, topic: str, data: Any = None, *, delay: Optional[float] = None,
                effect_time: Optional[datetime] = None, retry: Any = None, unique_key: Optional[str] = None,
                timeout: Optional[float] = None, key: Optional[str] = None, priority: int = 0,
                trace_context: str = "", result: bool = False, depends_on: Optional[Iterable[Any]] = None) -> Any:
        """Store one message as :meth:`tidemq.Client.produce` does (and with the producer's W3C
        traceparent, if any); return its id (a :class:`~tidemq.handles.Handle` with ``result``)."""
        return self.produce_many(topic, [data], delay=delay, effect_time=effect_time, retry=retry,
                                 unique_keys=[unique_key], keys=[key], priority=priority,
                                 trace_context=trace_context, result=result, depends_on=depends_on)[0]

    def produce_many(self, topic: str, datas: Iterable[Any], *, delay: Optional[float] = None,
                     effect_time: Optional[datetime] = None, retry: Any = None,
                     unique_keys: Optional[Sequence[Optional[str]]] = None, timeout: Optional[float] = None,
                     keys: Optional[Sequence[Optional[str]]] = None, priority: int = 0,
                     trace_context: str = "", result: bool = False,
                     depends_on: Optional[Iterable[Any]] = None) -> list[Any]:
        """Store many messages of one topic, all or none; return their ids (handles). With
        ``depends_on`` each waits (WAITING) until those messages succeeded."""
        datas = list(datas)
        check_batch_size(datas)
        topic, priority = check_topic(topic), check_priority(priority)
        delay, due_at = check_when(delay, effect_time)
        count, schedule = parse_retry(retry)
        texts = [encode_data(data) for data in datas]
        uniques = [check_unique_key(k) or None for k in (unique_keys or [None] * len(datas))]
        flow_keys = [check_flow_key(k) or None for k in (keys or [None] * len(datas))]
        waits_on = tuple(dependency_ids(depends_on))
        with self._cond:
            now = self._now()
            due = after(now, delay) if delay is not None else now if due_at is None else stored_time(due_at)
            retries = self.topic(topic).retry_count if count < 0 else count
            if waits_on:
                rows = [new_row(0, topic, text, due, retries, schedule, unique, trace_context, priority, flow_key)
                        for text, unique, flow_key in zip(texts, uniques, flow_keys)]
                ids = self._insert_steps(rows, [(waits_on, ())] * len(rows), now)
                self._cond.notify_all()
                return [Handle(i, self) for i in ids] if result else ids
            change = lifecycle.produce(now, broker=self.name)
            ids = []
            for text, unique, flow_key in zip(texts, uniques, flow_keys):
                same = [i for i, row in self._rows.items()
                        if unique and (row[M.topic], row[M.unique_key]) == (topic, unique)]
                if same:  # one message per (topic, unique_key): the stored one's id
                    ids.append(same[0])
                    continue
                row = new_row(self._new_id(), topic, text, due, retries, schedule, unique, trace_context, priority,
                              flow_key)
                self._rows[row[M.id]] = row
                self._apply(row, change)
                ids.append(row[M.id])
            self._cond.notify_all()
            return [Handle(i, self) for i in ids] if result else ids

    def submit(self, workflow: Workflow, timeout: Optional[float] = None, result: bool = False) -> list[Any]:
        """Store every step of ``workflow`` at once, as :meth:`tidemq.Client.submit` does (all or
        none); return their ids in the order they were added (with ``result``: handles)."""
        messages = workflow.messages(DEFAULT_MAX_DATA_BYTES)
        with self._cond:
            now = self._now()
            rows, waits = [], []
            for msg in messages:
                when = msg.WhichOneof("when")
                due = after(now, msg.delay_seconds) if when == "delay_seconds" else \
                    stored_time(msg.effect_time_ms / 1000) if when == "effect_time_ms" else now
                retries = self.topic(msg.topic).retry_count if msg.retry < 0 else msg.retry
                rows.append(new_row(0, msg.topic, msg.data, due, retries, list(msg.retry_schedule) or None,
                                    msg.unique_key or None, msg.trace_context, msg.priority, msg.key or None))
                waits.append((tuple(msg.depends_on), tuple(msg.after)))
            ids = self._insert_steps(rows, waits, now, policy_of([msg.wait_mode for msg in messages]))
            self._cond.notify_all()
        return [Handle(i, self) for i in ids] if result else ids  # type: ignore[arg-type]

    # -- internals (called with the lock held) -----------------------------------------------
    def _insert_steps(self, rows: list[Row], waits: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
                      now: datetime, policy: str = "stop") -> list[int]:
        """Store ``rows`` as steps waiting on stored ids and on positions of other rows, each
        pair of ``waits``; refused whole before anything is stored."""
        order = _check(rows, waits)
        wanted = sorted({id for depends_on, _ in waits for id in depends_on})
        unknown = [id for id in wanted if id not in self._rows]
        if unknown:
            raise UnknownDependencyError(f"no stored message has the id {', '.join(map(str, unknown[:10]))}: a "
                                         "dependency must name a message that is stored (produced and not yet removed)")
        ids = [self._new_id() for _ in rows]
        stopped: dict[int, tuple[int, str]] = {}  # position -> (the dependency that stops it, its status)
        for i in order:
            depends_on, after_steps = waits[i]
            stored = sorted(set(depends_on))
            failed = next((id for id in stored if self._rows[id][M.status] in _ENDED), None)
            by_step = next((j for j in sorted(set(after_steps)) if j in stopped), None)
            if failed is not None:
                stopped[i] = (failed, self._rows[failed][M.status])
            elif by_step is not None:
                stopped[i] = (ids[by_step], MessageStatus.CANCELLED.value)
            left = sum(1 for id in stored if self._rows[id][M.status] != _SUCCESS) + len(set(after_steps))
            row = rows[i]
            row[M.id] = ids[i]
            self._rows[ids[i]] = row
            self._apply(row, deps.waiting(now, left, broker=self.name))
            parents = tuple(sorted(set(stored) | {ids[j] for j in after_steps}))
            if parents:
                self._parents[ids[i]] = parents
                for parent in parents:
                    self._children.setdefault(parent, set()).add(ids[i])
        for i in order:  # parents first: each stop names a dependency already stopped
            if i in stopped:
                by, status = stopped[i]
                self._apply(self._rows[ids[i]], deps.dependency_failed(now, by, status, self.name))
        if any(depends_on or after_steps for depends_on, after_steps in waits):  # else a plain produce, as there
            self._new_workflow(ids, wanted, policy, now)
        return ids

    def _ended(self, msg_id: int, change: Change) -> None:
        """After ``change`` moved message ``msg_id``: release or stop what waits on it."""
        children = self._children.get(msg_id)
        if not children:
            return
        now = self._now()
        status = MessageStatus.CANCELLED.value if change.delete else change.target.value if change.target else ""
        for child in sorted(children):
            row = self._rows.get(child)
            if row is None or row[M.status] != _WAITING:
                continue
            if status == _SUCCESS:
                row[M.deps_left] -= 1
                if row[M.deps_left] == 0:
                    self._apply(row, deps.released(now, row[M.effect_time], msg_id, self.name))
            elif status in _ENDED:
                self._apply(row, deps.dependency_failed(now, msg_id, status, self.name))  # and on, transitively



def _check(rows: Sequence[Row], waits: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[int]:
    """The broker's refusals of a submission (``storages/steps.py``); the positions in an order
    where each comes after the steps it waits on."""
    check_workflow_steps(len(rows))
    for i, (row, (depends_on, after_steps)) in enumerate(zip(rows, waits)):
        count = len(set(depends_on))
        if count > MAX_DEPENDENCIES:
            raise WorkflowTooLargeError(f"step {i} waits on {count:,} stored messages, more than MAX_DEPENDENCIES "
                                        f"({MAX_DEPENDENCIES:,}): wait on a group of them through one step, or "
                                        "submit them in the same workflow")
        if row[M.unique_key]:
            raise DependencyError(f"step {i} has a unique_key {quote(row[M.unique_key])}: "
                                  "a step with dependencies or in a workflow takes none")
        for j in after_steps:
            if not 0 <= j < len(rows):
                raise DependencyError(f"step {i} waits on step {j}, but the submission has steps 0 to {len(rows) - 1}")
            if j == i:
                raise DependencyCycleError(f"step {i} waits on itself")
    waiting = [len(set(after_steps)) for _, after_steps in waits]
    children: dict[int, list[int]] = {}
    for i, (_, after_steps) in enumerate(waits):
        for j in set(after_steps):
            children.setdefault(j, []).append(i)
    order = [i for i, n in enumerate(waiting) if n == 0]
    for i in order:  # grows while it is walked
        for child in children.get(i, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                order.append(child)
    if len(order) < len(rows):
        ordered = set(order)
        at, path = next(i for i in range(len(rows)) if i not in ordered), []
        while at not in path:  # every step left over waits on another one left over
            path.append(at)
            at = next(j for j in waits[at][1] if j not in ordered)
        loop = path[path.index(at):] + [at]
        raise DependencyCycleError("steps wait on each other in a cycle (each on the next): "
                                   + " -> ".join(f"step {i}" for i in loop[:13]))
    return order
