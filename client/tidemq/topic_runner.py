"""Runs one TOPIC (broadcast) consumer: every broadcast sent while it is online, in order."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Optional

from . import tracing
from .consumer import ConsumerSpec
from .coordinator import Coordinator, Registration
from .errors import TidemqError
from .handling import HandlerWrapper, Run, deciding, in_log_context, in_span
from .lifecycle import HandlerOutcome
from .loop import EventLoopThread
from .message import Message

__all__ = ["BroadcastRunner"]

log = logging.getLogger(__name__)


class BroadcastRunner:
    """Reads ``<root>/broadcast/<topic>`` in sequence order from where it joined.

    The children watch always delivers the full list of sequence numbers, so a burst whose
    events coalesce loses nothing: the runner works through every number above its cursor.
    An ``async def`` handler runs on ``loop`` (the worker's; its own when none is given), one
    broadcast at a time like a threaded one, so the order holds.
    """

    def __init__(self, coordinator: Coordinator, spec: ConsumerSpec, instance: str,
                 loop: Optional[EventLoopThread] = None) -> None:
        self.coordinator = coordinator
        self.spec = spec
        self.instance = instance
        self._cond = threading.Condition()
        self._latest: list[int] = []
        self._cursor = -1
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tidemq-broadcast-{spec.topic}", daemon=True)
        self.registration: Optional[Registration] = None
        self._unwatch = lambda: None
        self.succeeded = self.failed = 0
        self._busy = False
        self._changed_at = time.monotonic()  # when the last broadcast was done (for idle_since)
        self._own_loop = EventLoopThread(f"tidemq-loop-{spec.topic}") if spec.is_async and loop is None else None
        # Only an async def handler runs on an event loop: a def handler in a worker that also
        # has async consumers still runs on the broadcast thread.
        self._events = (loop or self._own_loop) if spec.is_async else None
        # Log context, span and outcome around every run (tidemq.handling); no metrics: those
        # count stored messages.
        self._handling = HandlerWrapper([in_log_context, deciding(self._log_failure), in_span])

    def start(self) -> None:
        coordinator = self.coordinator
        # Read the newest sequence before registering: a broadcast sent once we are registered
        # (online) is then always above the cursor, and none is skipped in between.
        existing = coordinator.broadcast_sequences(self.spec.topic)
        self._cursor = existing[-1] if existing else -1
        self.registration = coordinator.register_consumer(self.spec.topic, self.instance)
        self._unwatch = coordinator.watch_broadcasts(self.spec.topic, self._on_sequences)
        if self._own_loop is not None:
            self._own_loop.start()
        self._thread.start()

    def stop(self, drain_timeout: float = 30.0) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(drain_timeout)
        if self._own_loop is not None:
            self._own_loop.stop(drain_timeout)
        self._unwatch()
        if self.registration is not None:
            self.coordinator.unregister_consumer(self.registration)

    def idle_since(self) -> Optional[float]:
        """``time.monotonic()`` of the end of the last broadcast handled (or of the start), or
        None while one is being handled."""
        with self._cond:
            return None if self._busy else self._changed_at

    def _on_sequences(self, sequences: list[int]) -> None:
        with self._cond:
            self._latest = sequences
            self._cond.notify_all()

    def _pending(self) -> list[int]:
        return [s for s in self._latest if s > self._cursor]

    def _loop(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                self._cond.wait_for(lambda: self._stopping.is_set() or self._pending(), 1.0)
                pending = sorted(self._pending())
            for seq in pending:
                if self._stopping.is_set():
                    return
                try:
                    payload = self.coordinator.read_broadcast(self.spec.topic, seq)
                except TidemqError as exc:
                    # ZooKeeper unreachable for now: keep the cursor and read this one again.
                    log.info("reading broadcast %d of %s failed (%s); retrying", seq, self.spec.topic, exc)
                    self._stopping.wait(0.5)
                    break
                with self._cond:
                    self._busy = True
                try:
                    self._run(seq, payload)
                finally:
                    with self._cond:
                        self._busy, self._changed_at = False, time.monotonic()
                self._cursor = seq

    def _run(self, seq: int, payload: Optional[bytes]) -> None:
        if payload is None:
            log.warning("broadcast %d of %s was pruned before it was read", seq, self.spec.topic)
            return
        try:
            envelope = json.loads(payload)
        except ValueError:
            log.error("broadcast %d of %s is not tidemq's JSON envelope; skipped", seq, self.spec.topic)
            return
        sent_at = datetime.fromtimestamp(envelope.get("sent_at", 0) / 1000, tz=timezone.utc)
        context = envelope.get("trace_context") or ""
        context = context if isinstance(context, str) and tracing.trace_id_of(context) else ""
        message = Message(id=seq, topic=self.spec.topic, data=envelope.get("data"), effect_time=sent_at,
                          trace_context=context)
        run = Run(seq, self.spec.topic, 1, context, sent_at)  # broadcasts are not retried
        handler = self.spec.handler
        if self._events is None:
            outcome = self._handling.run(run, lambda: handler(message))
        else:
            # In a task of the loop, where the layers' context variables are the task's own.
            try:
                outcome = self._events.submit(
                    self._handling.run_async(run, lambda: handler(message))).result()  # type: ignore[arg-type]
            except Exception:  # the loop itself failed (it stopped under us): the broadcast is not retried
                log.exception("handler of broadcast %d of %s could not run", seq, self.spec.topic)
                outcome = HandlerOutcome.FAIL
        if outcome is HandlerOutcome.SUCCESS:
            self.succeeded += 1
        else:
            self.failed += 1

    def _log_failure(self, run: Run) -> None:
        log.error("handler of broadcast %d of %s failed", run.id, self.spec.topic, exc_info=run.error)
