"""Runs one QUEUE or SERIAL_QUEUE consumer: registration, rank, pulling and handler slots; the leases
it holds and the outcomes it sends are kept by a LeaseKeeper and an AckSender."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Callable, Optional

from .ack_sender import AckSender
from .consumer import ConsumerSpec
from .coordinator import Coordinator, Registration, rank_of
from .drain import Drain
from .due import DueTimer, WorkQueue
from .errors import PullCancelledError, RetriableError, TidemqError
from .handling import HandlerWrapper, Run, deciding, in_log_context, in_span, measured
from .lease_keeper import HOLD, UNCONFIRMED_RETRY, LeaseKeeper, StartCheck
from .lifecycle import HandlerOutcome
from .limits import new_lease_token
from .link import BrokerLink, Delivery, LeaseRef, PullHandle
from .loop import AsyncHandlers, EventLoopThread
from .message import Message, MessageType
from .prefetch import Prefetch

__all__ = ["QueueRunner", "delivery_to_message"]

log = logging.getLogger(__name__)
# Failed pulls: the first retry at once (one lost database connection is over by then), then
_PULL_RETRY_FIRST, _PULL_RETRY_MOST = 0.1, 1.0  # s, doubling, capped: the pace returns soon after an outage
# Seconds a give-back may wait for a broker. It only spares its messages the wait for their lease
# to expire, and when a whole stack stops no broker will ever answer it (a stopping worker spent
# its whole drain timeout retrying it).
_GIVE_BACK_MOST = 2.0


def delivery_to_message(d: Delivery, link: Optional[BrokerLink] = None,
                        touch: Optional[Callable[[float], bool]] = None) -> Message:
    """Build the handler's Message from a delivery; its ``touch`` extends the lease through
    ``link`` (or calls ``touch`` when given), and its inputs are read with ``link.results``."""
    if touch is None and link is not None:
        touch = lambda ttr, _id=d.id, _token=d.lease_token: link.touch(_id, _token, ttr)  # noqa: E731
    read = getattr(link, "results", None) if d.depends_on else None  # a link that reads results: Client, stub
    if read is not None and d.broker:
        # The broker that leased it saw its dependencies' results committed: on Galera with a
        # writer node per broker another node may not have applied them yet.
        read = functools.partial(read, broker=d.broker)
    return Message.from_json(d.id, d.topic, d.data, effect_time=d.effect_time, retry_remaining=d.retry_remaining,
                             attempt=d.attempt, lease_token=d.lease_token, ttr=d.ttr,
                             trace_context=d.trace_context, depends_on=d.depends_on, workflow_id=d.workflow_id,
                             _touch=touch, _results=read)


class QueueRunner:
    """One consumer of a QUEUE or SERIAL_QUEUE topic.

    A fetch thread long-polls for at most ``threads + batch`` leased, unacknowledged messages at
    a time (bounded prefetch; without ``batch`` the pull size follows the handler's run time, see
    :mod:`tidemq.prefetch`), a pool of ``threads`` runs handlers (each run inside the
    :class:`~tidemq.handling.HandlerWrapper`), a :class:`~tidemq.lease_keeper.LeaseKeeper` beats
    every lease the runner holds and an :class:`~tidemq.ack_sender.AckSender` sends outcomes
    (kept until a broker records them).
    Rank and total come from the topic's consumer nodes and are re-read before every pull. A
    SERIAL_QUEUE consumer pulls only while it is rank 0, one message at a time, and asks for the
    next only after the previous outcome is recorded.

    While ZooKeeper cannot be reached the runner keeps pulling with the rank and total it last
    saw: brokers and the database do not need ZooKeeper, and the lock (a conditional UPDATE, and
    for a serial topic the topic row's lock) keeps two consumers that believe they own the same
    shard from running a message twice. A lost session registers a new node once reconnected,
    and the new ranks apply from the next pull.

    Pulls may lease delayed messages up to ``spec.ahead`` seconds before they are due; a timer
    thread hands each to the handlers at its effect_time, never before, ahead of what was
    prefetched meanwhile (``due.WorkQueue``), so how late a delayed message runs depends on
    this process's timer, not on a lock transaction after it is due nor on the backlog.
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
        # The pull size and prefetch bound: fixed by spec.batch, else following the handler's run time.
        self._prefetch = Prefetch(spec.slots, spec.batch, self.serial)
        self._cond = threading.Condition()
        self._inflight = 0  # leased and not yet acked: what the prefetch bound counts
        self._changed_at = time.monotonic()  # when _inflight last changed (for idle_since)
        self._nodes: list[str] = []
        self._pull: Optional[PullHandle] = None  # the long-poll in flight, cancelled when re-ranked
        self._pull_shard: Optional[tuple[int, int]] = None  # the (rank, total) it was sent with
        self._stopping = threading.Event()
        # What the runner owns besides its pulls: the leases it holds (heartbeats) and the
        # outcomes on their way (acks), both bounded by one drain deadline when it stops.
        self._drain = Drain()
        # A serial head runs as soon as it is leased: it keeps the plain ttr lease.
        self._keeper = LeaseKeeper(link, spec, lambda: self._consumer, self._drain, 0.0 if self.serial else HOLD)
        # A serial consumer's one slot frees once its outcome is recorded, a QUEUE slot when its
        # handler returns (see _finish).
        self._acks = AckSender(link, spec, lambda: self._consumer, self._keeper, self._drain,
                               self._release if self.serial else lambda n: None)
        # Handler threads take deliveries from one queue: an executor's Future and Condition per
        # message were a third of a worker's CPU at thousands of messages a second.
        self._work = WorkQueue()
        self._own_loop: Optional[EventLoopThread] = None
        self._tasks: Optional[AsyncHandlers] = None  # async handlers: tasks instead of handler threads
        if spec.is_async:
            if loop is None:
                loop = self._own_loop = EventLoopThread(f"tidemq-loop-{spec.topic}")
            self._tasks = AsyncHandlers(loop, self._handle_async, 1 if self.serial else spec.slots)
        # Deliveries leased ahead of their effect_time wait here for it, then start ahead of
        # what the pulls prefetched meanwhile.
        tasks = self._tasks
        self._due = DueTimer(self._work.put if tasks is None else tasks.put,
                             self._work.put_on_time if tasks is None else functools.partial(tasks.put, on_time=True),
                             name=f"tidemq-timer-{spec.topic}")
        # Log context, span, metrics and the outcome around every run (tidemq.handling).
        self._handling = HandlerWrapper([measured, in_log_context, deciding(self._log_failure), in_span], results=True)
        self._threads: list[threading.Thread] = []
        self._handlers: list[threading.Thread] = []
        self.registration: Optional[Registration] = None
        self._unwatch: Callable[[], None] = lambda: None

    @property
    def succeeded(self) -> int:
        """Outcomes recorded as a success."""
        return self._acks.succeeded

    @property
    def failed(self) -> int:
        """Outcomes recorded as a failure."""
        return self._acks.failed

    @property
    def stale(self) -> int:
        """Messages whose lease was lost before their outcome was recorded."""
        return self._keeper.stale + self._acks.stale

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.registration = self.coordinator.register_consumer(self.spec.topic, self.instance)
        self._unwatch = self.coordinator.watch_consumers(self.spec.topic, self._on_members)
        self._keeper.start(self.coordinator)  # a cancel signal of the topic brings its beat forward
        self._acks.start()
        self._threads = [self._spawn(self._fetch_loop, "fetch")]
        self._due.start()
        if self._own_loop is not None:
            self._own_loop.start()
        if self._tasks is None:
            self._handlers = [self._spawn(self._handler_loop, f"handler-{i}") for i in range(self.spec.threads)]

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"tidemq-{name}-{self.spec.topic}", daemon=True)
        thread.start()
        return thread

    def stop_pulling(self) -> None:
        """Take nothing new (the first step of :meth:`stop`; a worker stops every runner's pulls
        at once before draining them one by one)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._cancel_pull()

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop pulling, let running and prefetched handlers finish, send their outcomes, leave
        the topic: all within ``drain_timeout`` seconds. What is not done by then is left to its
        lease: an outcome no broker took (every broker gone) is dropped, and its message runs
        again once its lease expires."""
        deadline = time.monotonic() + drain_timeout

        def left() -> float:
            return max(deadline - time.monotonic(), 0.0)

        self._drain.until(deadline)
        self.stop_pulling()
        [fetch] = self._threads
        fetch.join(left() + 1.0)  # its pull was cancelled; it may be giving the lease back
        with self._cond:
            # Messages leased ahead run at their time (at most spec.ahead from now) and count here.
            self._cond.wait_for(lambda: self._inflight == 0, left())
        self._due.stop(left())
        # Out of time: async handlers still running are cancelled (a thread cannot be).
        unfinished = self._tasks.cancel(left()) if self._tasks is not None else []
        self._acks.finish()
        self._keeper.stop()  # beats until the last outcome was recorded or given up
        for _ in self._handlers:
            self._work.put(None)
        for token in sorted({d.lease_token for d in unfinished}):
            self._give_back(token)  # after the acks: a token's finished messages are recorded first
        if self._own_loop is not None:
            self._own_loop.stop(left())
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

    def _cancel_pull(self) -> None:
        with self._cond:
            handle = self._pull
        if handle is not None:
            handle.cancel()

    # -- pulling -----------------------------------------------------------------------------
    def _ready(self) -> bool:
        if self._prefetch.capacity - self._inflight < self._prefetch.min_pull:
            return False
        rank, _ = self._shard()
        return rank == 0 if self.serial else rank >= 0

    def _fetch_loop(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            with self._cond:
                if not self._cond.wait_for(lambda: self._stopping.is_set() or self._ready(), 0.5):
                    continue
                if self._stopping.is_set():
                    return
                want = min(self._prefetch.window, self._prefetch.capacity - self._inflight)
                rank, total = self._pull_shard = self._shard()
                # Made under the same lock the coordination events take, so a rank change or a
                # suspension that comes after this point always finds the handle to cancel.
                handle = self._pull = PullHandle()
            # The token is ours before the call: if we abandon the call, whatever the broker locked
            # under it (even in a reply already on its way) can be given back at once.
            token = new_lease_token()
            try:
                deliveries = self.link.pull(
                    self.spec.topic, self._consumer, rank=rank, total=total, serial=self.serial, max_messages=want,
                    wait=self._long_poll, ttr=self.spec.ttr, lease_token=token, track=handle, ahead=self.spec.ahead,
                    hold=self._keeper.hold_seconds)
                backoff = 0.0
            except PullCancelledError:
                self._give_back(token)
                continue  # suspended, re-ranked or stopping: the loop decides what to do next
            except TidemqError as exc:
                # A retriable failure is logged once by the pool; a refusal (a bug of ours) here.
                retriable = isinstance(exc, RetriableError)
                log.log(logging.DEBUG if retriable else logging.ERROR, "pull of %s failed: %s", self.spec.topic, exc)
                self._give_back(token)
                self._stopping.wait(backoff if retriable else max(backoff, _PULL_RETRY_FIRST))  # refused: not at once
                backoff = min(max(backoff * 2, _PULL_RETRY_FIRST), _PULL_RETRY_MOST)
                continue
            finally:
                with self._cond:
                    self._pull = None
            if not deliveries:
                continue
            with self._cond:
                self._inflight += len(deliveries)
                self._changed_at = time.monotonic()
            self._keeper.hold(deliveries, time.monotonic())  # the reply's arrival: see LeaseKeeper.hold
            self._due.add(deliveries)

    def _give_back(self, token: str) -> None:
        """Release what an abandoned pull may have locked; if no broker answers, the lease
        simply expires and the messages are delivered again then."""
        timeout = self._drain.call_timeout()
        timeout = _GIVE_BACK_MOST if timeout is None else min(timeout, _GIVE_BACK_MOST)
        try:
            released = self.link.release(token, self._consumer, timeout=timeout)
            if released:
                log.info("gave back %d message(s) of an abandoned pull of %s", released, self.spec.topic)
        except TidemqError as exc:
            level = logging.DEBUG if isinstance(exc, RetriableError) else logging.INFO
            log.log(level, "could not give back an abandoned pull of %s: %s", self.spec.topic, exc)

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
        run = self._start(delivery)
        started = time.perf_counter()
        if run.outcome is None:
            self._handling.run(run, lambda: self.spec.handler(self._message(delivery, run)))
        self._finish(delivery, run, time.perf_counter() - started)

    async def _handle_async(self, delivery: Delivery) -> None:
        """:meth:`_handle` for an ``async def`` handler, as a task on the event loop; a cancel
        request cancels the task while its handler runs."""
        if self._lost_before_start(delivery, extend=False):  # no call on the event loop
            return
        run = self._start(delivery)
        started = time.perf_counter()
        if run.outcome is None:
            task, loop, armed = asyncio.current_task(), asyncio.get_running_loop(), [True]
            assert task is not None and run.control is not None
            run.control.on_cancel(lambda: loop.call_soon_threadsafe(lambda: armed[0] and task.cancel()))
            try:
                await self._handling.run_async(
                    run, lambda: self.spec.handler(self._message(delivery, run)))  # type: ignore[arg-type]
            finally:
                armed[0] = False  # from here on the task reports the outcome: not to be cancelled
        self._finish(delivery, run, time.perf_counter() - started)

    def _start(self, delivery: Delivery) -> Run:
        """The run of ``delivery``; already CANCELLED when its cancel came while it waited."""
        run = Run.of(delivery)
        run.control = self._keeper.control(LeaseRef(delivery.id, delivery.lease_token))
        if run.control.cancelled:
            run.outcome = HandlerOutcome.CANCELLED
        return run

    def _lost_before_start(self, delivery: Delivery, extend: bool = True) -> bool:
        """True (and the slot freed) when a heartbeat found the lease gone while it waited (or its
        short lease may be running out: ``LeaseKeeper.before_start``). While the brokers cannot
        say (away, or their database), it waits for them: dropped, the message waited after
        their return for its lease to expire (up to a ttr: the outage grace) before it ran."""
        check = self._keeper.before_start(delivery, extend)
        while check is StartCheck.UNCONFIRMED and not self._stopping.wait(UNCONFIRMED_RETRY):
            check = self._keeper.before_start(delivery, extend)
        if check is StartCheck.UNCONFIRMED:  # stopping: left to its lease
            self._keeper.forget(delivery)
        elif check is StartCheck.LOST:  # it waited for a slot and a heartbeat found it gone: someone else may run it
            log.warning("message %d lost its lease while it waited for a handler slot; not running it", delivery.id,
                        extra={"tidemq_message_id": delivery.id, "tidemq_topic": delivery.topic})
        if check is not StartCheck.START:
            self._release(1)
        return check is not StartCheck.START

    def _log_failure(self, run: Run) -> None:
        log.warning("handler of %s failed on message %d: %r", self.spec.topic, run.id, run.error)

    def _message(self, delivery: Delivery, run: Run) -> Message:
        lease = LeaseRef(delivery.id, delivery.lease_token)
        message = delivery_to_message(delivery, self.link, touch=lambda ttr: self._keeper.touch(lease, ttr))
        message._control = run.control
        return message

    def _finish(self, delivery: Delivery, run: Run, seconds: float) -> None:
        """Queue the run's outcome for the ack thread and free the handler's slot; the run's
        ``seconds`` tune an adaptive pull size."""
        self._acks.report(run.ack(delivery.lease_token))
        if not self.serial:
            # A QUEUE slot frees when its handler returns: waiting for the ack's round trip too
            # held every slot one ack batch longer and cost a fifth of the consume rate. The
            # lease itself stays held (and beating) until the ack is sent.
            self._release(1, seconds)

    def _release(self, n: int, ran: Optional[float] = None) -> None:
        with self._cond:
            if ran is not None:
                self._prefetch.ran(ran)
            self._inflight -= n
            self._changed_at = time.monotonic()
            free = self._prefetch.capacity - self._inflight
            # Wake the fetch thread when a pull just became worthwhile, and stop() when the last message is
            # done; waking it on every message made it re-check its rank thousands of times a second.
            if free - n < self._prefetch.min_pull <= free or self._inflight == 0:
                self._cond.notify_all()
