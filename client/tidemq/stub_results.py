"""The StubBroker's result calls: progress and cancel flags with heartbeats, cancelling running
messages, and reading or waiting for results, each as the broker does them (the transitions of
:mod:`tidemq.lifecycle`, the checks of :mod:`tidemq.limits` and :mod:`tidemq.results`)."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any, Optional, Sequence

from . import lifecycle
from .clock import to_epoch_ms
from .coordinator import Coordinator
from .lifecycle import Change, MessageStatus
from .limits import MAX_RESULT_IDS, MAX_WAIT, check_lease_token
from .link import Heartbeat, LeaseRef, ProgressRef
from .results import MessageState, parse_progress, progress_text
from .tables import MESSAGE as M
from .errors import MalformedRequestError
from .validation import check_batch_size, check_lease_ttr

__all__ = ["StubResults"]

_RUNNING = MessageStatus.RUNNING.value


class StubResults:
    """Mixed into :class:`tidemq.stub.StubBroker`, which provides the state these calls use."""

    _cond: threading.Condition
    _rows: dict[int, dict[str, Any]]
    name: str
    coordinator: Optional[Coordinator]
    extend_calls: list[tuple[LeaseRef, ...]]

    def _now(self) -> datetime: ...  # provided by StubBroker
    def _call(self, method: str) -> None: ...  # provided by StubBroker
    def _apply(self, row: dict[str, Any], change: Change, lease_token: Optional[str] = None) -> bool: ...
    def _extend(self, msg_id: int, token: str, ttr: float) -> bool: ...

    def heartbeat(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
                  progress: Sequence[ProgressRef] = (), timeout: Optional[float] = None) -> Heartbeat:
        """``extend`` with progress reports; answers which messages' cancel was requested."""
        check_batch_size(leases, "leases")
        for lease in leases:
            check_lease_token(lease.lease_token)
        check_lease_ttr(ttr)
        with self._cond:
            self._call("extend")
            now = self._now()
            reports = [(p, progress_text(p.done, p.total, p.note, to_epoch_ms(now))) for p in progress]
            self.extend_calls.append(tuple(leases))
            extended = [self._extend(lease.id, lease.lease_token, ttr) for lease in leases]
            for report, text in reports:
                row = self._rows.get(report.id)
                if row is not None:
                    self._apply(row, lifecycle.report_progress(now, text), report.lease_token)
            flags = [(row := self._rows.get(lease.id)) is not None and row[M.status] == _RUNNING
                     and row[M.lease_token] == lease.lease_token and bool(row[M.cancel_requested])
                     for lease in leases]
            return Heartbeat(extended, flags)

    def _cancel_running(self, ids: Sequence[int]) -> tuple[list[bool], set[str]]:
        """Mark the RUNNING messages among ``ids`` (once each): True for each one marked, and
        their topics, to signal once the stub's lock is released (:meth:`_signal_cancels`)."""
        change = lifecycle.request_cancel(self._now(), broker=self.name)
        marked, topics = [], set()
        for msg_id in ids:
            row = self._rows.get(msg_id)
            running = row is not None and row[M.status] == _RUNNING
            if running:
                if not row[M.cancel_requested]:  # type: ignore[index]
                    self._apply(row, change)  # type: ignore[arg-type]
                topics.add(row[M.topic])  # type: ignore[index]
            marked.append(running)
        return marked, topics

    def _signal_cancels(self, topics: set[str]) -> None:
        """Send ``topics``' cancel signal through ``coordinator``, when there is one (outside the
        stub's lock: a coordinator may call back, or wait for its session)."""
        if self.coordinator is not None:
            for topic in sorted(topics):
                self.coordinator.signal_cancel(topic)

    def results(self, ids: Sequence[int], wait: float = 0.0, timeout: Optional[float] = None) -> list[MessageState]:
        """The state and result of each message; ``wait`` > 0: until one is final or gone."""
        check_batch_size(ids, "ids")
        if len(ids) > MAX_RESULT_IDS:
            raise MalformedRequestError(f"a Results call reads {len(ids)} ids; the limit is {MAX_RESULT_IDS} per call")
        if not (0 <= wait <= MAX_WAIT):
            raise MalformedRequestError(f"wait_seconds must be between 0 and {MAX_WAIT}, got {wait}")
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                states = [self._state(msg_id) for msg_id in ids]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or any(state.final for state in states):
                    return states
                self._cond.wait(remaining)

    def _state(self, msg_id: int) -> MessageState:
        row = self._rows.get(msg_id)
        if row is None:
            return MessageState(msg_id, False)
        return MessageState(msg_id, True, MessageStatus(row[M.status]), row[M.result], parse_progress(row[M.progress]),
                            row[M.effect_time], row[M.finish_time], bool(row[M.cancel_requested]))
