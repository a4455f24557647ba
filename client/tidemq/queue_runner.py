"""Runs one QUEUE or SERIAL_QUEUE consumer: registration, rank, pulling, handlers, heartbeats, acks."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Callable, Optional

from . import metrics, tracing
from .consumer import ConsumerSpec
from .coordinator import ConnectionState, Coordinator, Registration, rank_of
from .due import DueTimer
from .errors import PullCancelledError, RetriableError, TidemqError
from .link import AckItem, AckOutcome, BrokerLink, Delivery, LeaseRef, PullHandle
from .logs import message_context
from .loop import AsyncHandlers, EventLoopThread
from .message import Message, MessageType

__all__ = ["QueueRunner", "delivery_to_message"]

log = logging.getLogger(__name__)
_ACK_BATCH = 500


def delivery_to_message(d: Delivery, link: Optional[BrokerLink] = None,
                        touch: Optional[Callable[[float], bool]] = None) -> Message:
    """Build the handler's Message from a delivery; its ``touch`` extends the lease through
    ``link`` (or calls ``touch`` when given)."""
    if touch is None and link is not None:
        touch = lambda ttr, _id=d.id, _token=d.lease_token: link.touch(_id, _token, ttr)  # noqa: E731
    return Message.from_json(d.id, d.topic, d.data, effect_time=d.effect_time, retry_remaining=d.retry_remaining,
                             attempt=d.attempt, lease_token=d.lease_token, ttr=d.ttr,
                             trace_context=d.trace_context, _touch=touch)


class QueueRunner:
    """One consumer of a QUEUE or SERIAL_QUEUE topic.

    A fetch thread long-polls for at most ``threads + batch`` leased, unacknowledged messages at
    a time (bounded prefetch), a pool of ``threads`` runs handlers, an ack thread sends outcomes
    in batches, and a heartbeat thread extends every lease the runner holds in one call every
    ttr/3. Rank and total come from the topic's consumer nodes and are re-read before every
    pull. A SERIAL_QUEUE consumer pulls only while it is rank 0, one message at a time, and asks
    for the next only after the previous outcome is recorded.

    Pulls may lease delayed messages up to ``spec.ahead`` seconds before they are due; a timer
    thread hands each to the handlers at its effect_time, never before, so how late a delayed
    message runs depends on this process's timer, not on a lock transaction after it is due.
    Such a message counts against the prefetch bound and is heartbeaten like any other.

    An ``async def`` handler runs as tasks on ``loop`` (the worker's event loop; the runner
    makes its own when none is given), ``spec.concurrency`` at once, instead of on handler
    threads; everything else above is the same. A drain that runs out of time cancels the tasks
    still running and releases their leases, so their messages run again at once elsewhere.
    """

    def __init__(self, link: BrokerLink, coordinator: Coordinator, spec: ConsumerSpec, instance: str,
                 long_poll: float = 10.0, loop: Optional[EventLoopThread] = None) -> None:
        self.link = link
        self.coordinator = coordinator
        self.spec = spec
        self.instance = instance
        self.serial = spec.type is MessageType.SERIAL_QUEUE
        self._long_poll = long_poll
        self._capacity = 1 if self.serial else spec.slots + spec.batch
        # Pull only when there is room for a worthwhile batch: topping up the last few free
        # slots after every large pull meant a lock transaction per handful of messages.
        self._min_pull = 1 if self.serial else max(1, spec.batch // 2)
        self._cond = threading.Condition()
        self._inflight = 0  # leased and not yet acked: what the prefetch bound counts
        self._changed_at = time.monotonic()  # when _inflight last changed (for idle_since)
        self._nodes: list[str] = []
        self._connected = True
        self._pull: Optional[PullHandle] = None  # the long-poll in flight, cancelled on SUSPENDED
        self._pull_shard: Optional[tuple[int, int]] = None  # the (rank, total) it was sent with
        self._stopping = threading.Event()
        self._beat_stop = threading.Event()  # heartbeats go on through the drain, until the last ack
        self._leases_lock = threading.Lock()
        self._touched: dict[LeaseRef, float] = {}  # leases a handler lengthened with message.touch(ttr)
        self._held: set[LeaseRef] = set()  # prefetched, running or finished awaiting their ack
        self._lost: set[LeaseRef] = set()  # leases a heartbeat found gone before the handler started
        self._acks: "queue.SimpleQueue[Optional[AckItem]]" = queue.SimpleQueue()
        # Handler threads take deliveries from one queue: an executor's Future and Condition per
        # message were a third of a worker's CPU at thousands of messages a second.
        self._work: "queue.SimpleQueue[Optional[Delivery]]" = queue.SimpleQueue()
        self._own_loop: Optional[EventLoopThread] = None
        self._tasks: Optional[AsyncHandlers] = None  # async handlers: tasks instead of handler threads
        if spec.is_async:
            if loop is None:
                loop = self._own_loop = EventLoopThread(f"tidemq-loop-{spec.topic}")
            self._tasks = AsyncHandlers(loop, self._handle_async, 1 if self.serial else spec.slots)
        # Deliveries leased ahead of their effect_time wait here for it.
        self._due = DueTimer(self._work.put if self._tasks is None else self._tasks.put,
                             name=f"tidemq-timer-{spec.topic}")
        self._threads: list[threading.Thread] = []
        self._handlers: list[threading.Thread] = []
        self.registration: Optional[Registration] = None
        self._unwatch: Callable[[], None] = lambda: None
        self.succeeded = self.failed = self.stale = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.coordinator.add_state_listener(self._on_state)
        self.registration = self.coordinator.register_consumer(self.spec.topic, self.instance)
        self._unwatch = self.coordinator.watch_consumers(self.spec.topic, self._on_members)
        self._threads = [self._spawn(self._fetch_loop, "fetch"), self._spawn(self._ack_loop, "ack"),
                         self._spawn(self._heartbeat_loop, "heartbeat")]
        self._due.start()
        if self._own_loop is not None:
            self._own_loop.start()
        if self._tasks is None:
            self._handlers = [self._spawn(self._handler_loop, f"handler-{i}") for i in range(self.spec.threads)]

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"tidemq-{name}-{self.spec.topic}", daemon=True)
        thread.start()
        return thread

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop pulling, let running and prefetched handlers finish, send their acks, leave the topic."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._cancel_pull()
        fetch, ack, heartbeat = self._threads
        fetch.join(self._long_poll + drain_timeout)
        with self._cond:
            # Messages leased ahead run at their time (at most spec.ahead from now) and count here.
            self._cond.wait_for(lambda: self._inflight == 0, drain_timeout)
        self._due.stop(drain_timeout)
        # Out of time: async handlers still running are cancelled (a thread cannot be).
        unfinished = self._tasks.cancel(drain_timeout) if self._tasks is not None else []
        self._acks.put(None)
        ack.join(drain_timeout)
        self._beat_stop.set()
        heartbeat.join(drain_timeout)
        for _ in self._handlers:
            self._work.put(None)
        for token in sorted({d.lease_token for d in unfinished}):
            self._give_back(token)  # after the acks: a token's finished messages are recorded first
        if self._own_loop is not None:
            self._own_loop.stop(drain_timeout)
        self._unwatch()
        if self.registration is not None:
            self.coordinator.unregister_consumer(self.registration)

    def idle_since(self) -> Optional[float]:
        """``time.monotonic()`` of the moment the last held message was done (or of the start),
        or None while any message is leased and not yet acknowledged."""
        with self._cond:
            return None if self._inflight else self._changed_at

    @property
    def rank(self) -> tuple[int, int]:
        """(rank, total) as this consumer sees it now; rank -1 until it sees its own node."""
        with self._cond:
            return self._shard()

    def _shard(self) -> tuple[int, int]:
        return rank_of(self.registration.node if self.registration else None, self._nodes)

    @property
    def _consumer(self) -> str:
        return self.registration.node if self.registration else ""

    # -- coordination events -----------------------------------------------------------------
    def _on_members(self, nodes: list[str]) -> None:
        with self._cond:
            self._nodes = list(nodes)
            # A long-poll waiting with the old (rank, total) would leave a departed consumer's
            # share untaken (or keep taking a share now someone else's) until it returns.
            stale_pull = self._pull is not None and self._shard() != self._pull_shard
            self._cond.notify_all()
        if stale_pull:
            self._cancel_pull()

    def _on_state(self, state: ConnectionState) -> None:
        # SUSPENDED: our node may be gone for others; take nothing new until we know. That
        # includes a long-poll already waiting at a broker with our old rank: cancel it.
        with self._cond:
            self._connected = state is ConnectionState.CONNECTED
            self._cond.notify_all()
        if state is not ConnectionState.CONNECTED:
            self._cancel_pull()

    def _cancel_pull(self) -> None:
        with self._cond:
            handle = self._pull
        if handle is not None:
            handle.cancel()

    # -- pulling -----------------------------------------------------------------------------
    def _ready(self) -> bool:
        if not self._connected or self._capacity - self._inflight < self._min_pull:
            return False
        rank, _ = self._shard()
        return rank == 0 if self.serial else rank >= 0

    def _fetch_loop(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            with self._cond:
                if not self._cond.wait_for(lambda: self._stopping.is_set() or self._ready(), 0.5):
                    continue
                if self._stopping.is_set():
                    return
                want = min(self.spec.batch, self._capacity - self._inflight)
                rank, total = self._pull_shard = self._shard()
                # Made under the same lock the coordination events take, so a rank change or a
                # suspension that comes after this point always finds the handle to cancel.
                handle = self._pull = PullHandle()
            # The token is ours before the call: if we abandon the call, whatever the broker locked
            # under it (even in a reply already on its way) can be given back at once.
            token = uuid.uuid4().hex
            try:
                deliveries = self.link.pull(
                    self.spec.topic, self._consumer, rank=rank, total=total, serial=self.serial, max_messages=want,
                    wait=self._long_poll, ttr=self.spec.ttr, lease_token=token, track=handle, ahead=self.spec.ahead)
                backoff = 0.1
            except PullCancelledError:
                self._give_back(token)
                continue  # suspended, re-ranked or stopping: the loop decides what to do next
            except TidemqError as exc:
                level = logging.INFO if isinstance(exc, RetriableError) else logging.ERROR
                log.log(level, "pull of %s failed: %s", self.spec.topic, exc)
                self._give_back(token)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            finally:
                with self._cond:
                    self._pull = None
            if not deliveries:
                continue
            with self._cond:
                self._inflight += len(deliveries)
                self._changed_at = time.monotonic()
            with self._leases_lock:
                self._held.update(LeaseRef(d.id, d.lease_token) for d in deliveries)
            self._due.add(deliveries)

    def _give_back(self, token: str) -> None:
        """Release what an abandoned pull may have locked; if no broker answers, the lease
        simply expires and the messages are delivered again then."""
        try:
            released = self.link.release(token, self._consumer)
            if released:
                log.info("gave back %d message(s) of an abandoned pull of %s", released, self.spec.topic)
        except TidemqError as exc:
            log.info("could not give back an abandoned pull of %s: %s", self.spec.topic, exc)

    # -- running handlers --------------------------------------------------------------------
    def _handler_loop(self) -> None:
        while True:
            delivery = self._work.get()
            if delivery is None:
                return
            try:
                self._handle(delivery)
            except Exception:  # a bug of ours must not take a handler thread down with it
                log.exception("handling message %d of %s failed", delivery.id, self.spec.topic)

    def _handle(self, delivery: Delivery) -> None:
        if self._lost_before_start(delivery):
            return
        error: Optional[Exception] = None
        started = metrics.handler_started(self.spec.topic, delivery.effect_time)
        # Log lines made while it runs name the message; its span joins the producer's trace.
        with message_context(delivery.id, delivery.topic, delivery.trace_context):
            try:
                with tracing.handler_span(delivery.topic, delivery.id, delivery.attempt, delivery.trace_context):
                    self.spec.handler(self._message(delivery))
            except Exception as exc:  # the handler's failure is the message's outcome, not ours
                error = exc
                log.warning("handler of %s failed on message %d: %r", self.spec.topic, delivery.id, exc)
        self._finish(delivery, started, error)

    async def _handle_async(self, delivery: Delivery) -> None:
        """:meth:`_handle` for an ``async def`` handler, as a task on the event loop."""
        if self._lost_before_start(delivery):
            return
        error: Optional[Exception] = None
        started = metrics.handler_started(self.spec.topic, delivery.effect_time)
        # The context variables these set are the task's own: concurrent handlers do not mix.
        with message_context(delivery.id, delivery.topic, delivery.trace_context):
            try:
                with tracing.handler_span(delivery.topic, delivery.id, delivery.attempt, delivery.trace_context):
                    await self.spec.handler(self._message(delivery))  # type: ignore[misc]
            except Exception as exc:  # the handler's failure is the message's outcome, not ours
                error = exc
                log.warning("handler of %s failed on message %d: %r", self.spec.topic, delivery.id, exc)
        self._finish(delivery, started, error)

    def _lost_before_start(self, delivery: Delivery) -> bool:
        """True (and the slot freed) when a heartbeat found the lease gone while it waited."""
        lease = LeaseRef(delivery.id, delivery.lease_token)
        with self._leases_lock:
            lost = lease in self._lost
            self._lost.discard(lease)
        if lost:  # it waited for a slot and a heartbeat found it gone: someone else may run it
            self.stale += 1
            log.warning("message %d lost its lease while it waited for a handler slot; not running it", delivery.id,
                        extra={"tidemq_message_id": delivery.id, "tidemq_topic": delivery.topic})
            self._release(1)
        return lost

    def _message(self, delivery: Delivery) -> Message:
        lease = LeaseRef(delivery.id, delivery.lease_token)
        return delivery_to_message(delivery, touch=lambda ttr: self._touch(lease, ttr))

    def _finish(self, delivery: Delivery, started: float, error: Optional[Exception]) -> None:
        """Queue the outcome for the ack thread and free the handler's slot."""
        item = AckItem(delivery.id, delivery.lease_token, True)
        if error is not None:
            item = AckItem(delivery.id, delivery.lease_token, False, f"{type(error).__name__}: {error}")
        metrics.handler_finished(self.spec.topic, started, item.success, delivery.retry_remaining)
        self._acks.put(item)
        if not self.serial:
            # A QUEUE slot frees when its handler returns: waiting for the ack's round trip too
            # held every slot one ack batch longer and cost a fifth of the consume rate. The
            # lease itself stays held (and beating) until the ack is sent.
            self._release(1)

    def _touch(self, lease: LeaseRef, ttr: float) -> bool:
        """``message.touch(ttr)``: extend now, and keep a longer ttr for later heartbeats so they
        do not shorten the lease the handler asked for."""
        extended = self.link.touch(lease.id, lease.lease_token, ttr)
        with self._leases_lock:
            if extended and ttr > self.spec.ttr and lease in self._held:
                self._touched[lease] = ttr
            else:
                self._touched.pop(lease, None)
        return extended

    def _release(self, n: int) -> None:
        with self._cond:
            self._inflight -= n
            self._changed_at = time.monotonic()
            free = self._capacity - self._inflight
            # Wake the fetch thread when a pull just became worthwhile, and stop() when the last
            # message is done; waking it on every message made it re-check its rank thousands
            # of times a second.
            if free - n < self._min_pull <= free or self._inflight == 0:
                self._cond.notify_all()

    # -- heartbeats --------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        # Every ttr/3: a lease then always has two thirds of its life left when it is extended,
        # so one failed heartbeat (a broker failing over) does not lose it.
        while not self._beat_stop.wait(self.spec.ttr / 3):
            self._beat()

    def _beat(self) -> None:
        """Extend every lease held now in one call (one per ttr when a handler lengthened its
        lease with ``touch``); forget (and report) those found lost."""
        with self._leases_lock:
            by_ttr: dict[float, list[LeaseRef]] = {}
            for lease in self._held:
                by_ttr.setdefault(self._touched.get(lease, self.spec.ttr), []).append(lease)
        for ttr, leases in by_ttr.items():
            self._beat_leases(leases, ttr)

    def _beat_leases(self, leases: list[LeaseRef], ttr: float) -> None:
        # One call always fits: at most threads + batch (2,024) leases, MAX_BATCH is 10,000.
        try:
            extended = self.link.extend(leases, ttr, self._consumer)
        except TidemqError as exc:
            log.info("heartbeat of %d lease(s) of %s failed (%s); next one in %.1f s",
                     len(leases), self.spec.topic, exc, self.spec.ttr / 3)
            return
        lost = []
        with self._leases_lock:
            for lease, ok in zip(leases, extended):
                # Not held any more: its ack went out meanwhile, and that is why it was not extended.
                if not ok and lease in self._held:
                    self._held.discard(lease)
                    self._touched.pop(lease, None)
                    self._lost.add(lease)
                    lost.append(lease.id)
        for msg_id in lost:
            log.warning("lease of message %d of %s was lost (expired or taken over): its ack will be "
                        "refused as STALE", msg_id, self.spec.topic,
                        extra={"tidemq_message_id": msg_id, "tidemq_topic": self.spec.topic})

    # -- acking ------------------------------------------------------------------------------
    def _ack_loop(self) -> None:
        while True:
            first = self._acks.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < _ACK_BATCH:  # coalesce whatever is already waiting, never wait
                try:
                    item = self._acks.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._acks.put(None)
                    break
                batch.append(item)
            try:
                self._send(batch)
            finally:
                if self.serial:
                    # A serial consumer asks for the next message only after this outcome is
                    # recorded: at most one message of the topic runs, cluster-wide.
                    self._release(len(batch))

    def _send(self, batch: list[AckItem]) -> None:
        """Send acks, retrying through broker failover for up to one ttr (the lease's life)."""
        with self._leases_lock:
            # Heartbeats stop here: after the ack a lease is gone anyway, and a heartbeat racing
            # the ack would report it lost.
            done = [LeaseRef(item.id, item.lease_token) for item in batch]
            self._held.difference_update(done)
            for lease in done:
                self._touched.pop(lease, None)
        for _ in range(max(int(self.spec.ttr / 0.5), 1)):
            try:
                outcomes = self.link.ack(self.spec.topic, self._consumer, batch)
                break
            except RetriableError as exc:
                log.info("ack of %d message(s) failed (%s); retrying", len(batch), exc)
                time.sleep(0.5)  # a back-off between attempts, not a wait for a condition
            except TidemqError as exc:  # refused as a whole (a bug of ours): retrying cannot help
                log.error("ack of %d message(s) of %s refused (%s): they will be delivered again",
                          len(batch), self.spec.topic, exc)
                return
        else:
            log.error("gave up acking %d message(s) of %s: they will be delivered again", len(batch), self.spec.topic)
            return
        for item, outcome in zip(batch, outcomes):
            if outcome is AckOutcome.STALE:
                self.stale += 1
                log.warning("ack of message %d refused: the lease was lost (it was or will be run elsewhere)", item.id)
            elif item.success:
                self.succeeded += 1
            else:
                self.failed += 1
