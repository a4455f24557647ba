"""Runs one QUEUE or SERIAL_QUEUE consumer: registration, rank, pulling, handlers, acks."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Callable, Optional

import grpc

from .client import Client
from .consumer import ConsumerSpec
from .coordinator import ConnectionState, Registration, rank_of
from .errors import RetriableError, TidemqError
from .message import Message, MessageType
from .rpc import tidemq_pb2 as pb

__all__ = ["QueueRunner", "delivery_to_message"]

log = logging.getLogger(__name__)
_ACK_BATCH = 500


def delivery_to_message(d: pb.Delivery, client: Optional[Client] = None) -> Message:
    """Build the handler's Message from a delivery; ``touch`` extends its lease through ``client``."""
    touch: Optional[Callable[[float], bool]] = None
    if client is not None:
        touch = lambda ttr, _id=d.id, _token=d.lease_token: client.touch(_id, _token, ttr)  # noqa: E731
    return Message.from_json(
        d.id, d.topic, d.data,
        effect_time=datetime.fromtimestamp(d.effect_time_ms / 1000, tz=timezone.utc),
        retry_remaining=d.retry_remaining, attempt=d.attempt, lease_token=d.lease_token,
        ttr=d.ttr_seconds, _touch=touch,
    )


class QueueRunner:
    """One consumer of a QUEUE or SERIAL_QUEUE topic.

    A fetch thread long-polls for at most ``threads + batch`` leased messages at a time (bounded
    prefetch), a pool of ``threads`` runs handlers, and an ack thread sends outcomes in batches.
    Rank and total come from the topic's consumer nodes and are re-read before every pull.
    A SERIAL_QUEUE consumer pulls only while it is rank 0, one message at a time, and asks for
    the next only after the previous outcome is recorded.
    """

    def __init__(self, client: Client, spec: ConsumerSpec, instance: str, long_poll: float = 10.0) -> None:
        self.client = client
        self.spec = spec
        self.instance = instance
        self.serial = spec.type is MessageType.SERIAL_QUEUE
        self._long_poll = long_poll
        self._capacity = 1 if self.serial else spec.threads + spec.batch
        # Pull only when there is room for a worthwhile batch: topping up the last few free
        # slots after every large pull meant a lock transaction per handful of messages.
        self._min_pull = 1 if self.serial else max(1, spec.batch // 2)
        self._cond = threading.Condition()
        self._inflight = 0
        self._nodes: list[str] = []
        self._connected = True
        self._pull: Optional[grpc.Future] = None  # the long-poll in flight, cancelled on SUSPENDED
        self._pull_shard: Optional[tuple[int, int]] = None  # the (rank, total) it was sent with
        self._pull_lock = threading.Lock()
        self._stopping = threading.Event()
        self._acks: "queue.SimpleQueue[Optional[pb.AckItem]]" = queue.SimpleQueue()
        # Handler threads take deliveries from one queue: an executor's Future and Condition per
        # message were a third of a worker's CPU at thousands of messages a second.
        self._work: "queue.SimpleQueue[Optional[tuple[pb.Delivery, float]]]" = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._handlers: list[threading.Thread] = []
        self.registration: Optional[Registration] = None
        self._unwatch = lambda: None
        self.succeeded = self.failed = self.stale = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        coordinator = self.client.coordinator
        coordinator.add_state_listener(self._on_state)
        self.registration = coordinator.register_consumer(self.spec.topic, self.instance)
        self._unwatch = coordinator.watch_consumers(self.spec.topic, self._on_members)
        self._threads = [self._spawn(self._fetch_loop, "fetch"), self._spawn(self._ack_loop, "ack")]
        self._handlers = [self._spawn(self._handler_loop, f"handler-{i}") for i in range(self.spec.threads)]

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"tidemq-{name}-{self.spec.topic}", daemon=True)
        thread.start()
        return thread

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop pulling, let running handlers finish, send their acks, then leave the topic."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._cancel_pull()
        self._threads[0].join(self._long_poll + self.client.settings.rpc_timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._inflight == 0, drain_timeout)
        self._acks.put(None)
        self._threads[1].join(drain_timeout)
        for _ in self._handlers:
            self._work.put(None)
        self._unwatch()
        if self.registration is not None:
            self.client.coordinator.unregister_consumer(self.registration)

    @property
    def rank(self) -> tuple[int, int]:
        """(rank, total) as this consumer sees it now; rank -1 until it sees its own node."""
        node = self.registration.node if self.registration else None
        with self._cond:
            return rank_of(node, self._nodes)

    # -- coordination events -----------------------------------------------------------------
    def _on_members(self, nodes: list[str]) -> None:
        with self._cond:
            self._nodes = list(nodes)
            shard = rank_of(self.registration.node if self.registration else None, self._nodes)
            self._cond.notify_all()
        # A long-poll waiting with the old (rank, total) would leave a departed consumer's share
        # untaken (or keep taking a share now someone else's) until it returns: ask again now.
        if self._pull_shard is not None and shard != self._pull_shard:
            self._cancel_pull()

    def _on_state(self, state: ConnectionState) -> None:
        # SUSPENDED: our node may be gone for others; take nothing new until we know. That
        # includes a long-poll already waiting at a broker with our old rank: cancel it.
        with self._cond:
            self._connected = state is ConnectionState.CONNECTED
            self._cond.notify_all()
        if state is not ConnectionState.CONNECTED:
            self._cancel_pull()

    def _track(self, future: Optional[grpc.Future]) -> None:
        with self._pull_lock:
            self._pull = future
        if future is not None and (not self._connected or self._stopping.is_set() or self._shard_changed()):
            future.cancel()  # the state changed between the check and the call

    def _shard_changed(self) -> bool:
        with self._cond:
            current = rank_of(self.registration.node if self.registration else None, self._nodes)
            return self._pull_shard is not None and current != self._pull_shard

    def _cancel_pull(self) -> None:
        with self._pull_lock:
            future = self._pull
        if future is not None:
            future.cancel()

    # -- pulling -----------------------------------------------------------------------------
    def _ready(self) -> bool:
        if not self._connected or self._capacity - self._inflight < self._min_pull:
            return False
        rank, _ = rank_of(self.registration.node if self.registration else None, self._nodes)
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
                rank, total = rank_of(self.registration.node, self._nodes)  # type: ignore[union-attr]
                self._pull_shard = (rank, total)
            # The token is ours before the call: if we abandon the call, whatever the broker locked
            # under it (even in a reply already on its way) can be given back at once.
            token = uuid.uuid4().hex
            request = pb.PullRequest(
                topic=self.spec.topic, consumer=self.registration.node, rank=rank, total=total,  # type: ignore[union-attr]
                serial=self.serial, max_messages=want, wait_seconds=self._long_poll, ttr_seconds=self.spec.ttr,
                lease_token=token)
            try:
                reply = self.client.pull_request(request, self._long_poll + self.client.settings.rpc_timeout,
                                                 track=self._track)
                deliveries = list(reply.messages)
                backoff = 0.1
            except grpc.FutureCancelledError:
                self._give_back(token)
                continue  # suspended, re-ranked or stopping: the loop decides what to do next
            except TidemqError as exc:
                level = logging.INFO if isinstance(exc, RetriableError) else logging.ERROR
                log.log(level, "pull of %s failed: %s", self.spec.topic, exc)
                self._give_back(token)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if not deliveries:
                continue
            received = time.monotonic()
            with self._cond:
                self._inflight += len(deliveries)
            for delivery in deliveries:
                self._work.put((delivery, received))

    def _give_back(self, token: str) -> None:
        """Release what an abandoned pull may have locked; if no broker answers, the lease
        simply expires and the messages are delivered again then."""
        try:
            released = self.client.release(token, self.registration.node if self.registration else "", timeout=5)
            if released:
                log.info("gave back %d message(s) of an abandoned pull of %s", released, self.spec.topic)
        except TidemqError as exc:
            log.info("could not give back an abandoned pull of %s: %s", self.spec.topic, exc)

    def _still_ours(self, delivery: pb.Delivery, received: float) -> bool:
        """A prefetched message's lease runs while it waits for a thread: past half of it,
        extend the lease before starting, and skip the message if it was already lost."""
        if not delivery.ttr_seconds or time.monotonic() - received < delivery.ttr_seconds / 2:
            return True
        try:
            return self.client.touch(delivery.id, delivery.lease_token, delivery.ttr_seconds)
        except TidemqError as exc:  # cannot tell: run it (delivery is at-least-once anyway)
            log.info("could not extend the lease of message %d: %s", delivery.id, exc)
            return True

    def _handler_loop(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            try:
                self._handle(*job)
            except Exception:  # a bug of ours must not take a handler thread down with it
                log.exception("handling message %d of %s failed", job[0].id, self.spec.topic)

    def _handle(self, delivery: pb.Delivery, received: float) -> None:
        if not self._still_ours(delivery, received):
            self.stale += 1
            log.warning("message %d waited past its lease and went elsewhere; not running it", delivery.id)
            self._release(1)
            return
        item = pb.AckItem(id=delivery.id, lease_token=delivery.lease_token, success=True)
        try:
            self.spec.handler(delivery_to_message(delivery, self.client))
        except Exception as exc:  # the handler's failure is the message's outcome, not ours
            log.warning("handler of %s failed on message %d: %r", self.spec.topic, delivery.id, exc)
            item.success = False
            item.error = f"{type(exc).__name__}: {exc}"
        self._acks.put(item)
        if not self.serial:
            self._release(1)

    def _release(self, n: int) -> None:
        with self._cond:
            self._inflight -= n
            free = self._capacity - self._inflight
            # Wake the fetch thread when a pull just became worthwhile, and stop() when the last
            # message is done; waking it on every message made it re-check its rank thousands
            # of times a second.
            if free - n < self._min_pull <= free or self._inflight == 0:
                self._cond.notify_all()

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
            self._send(batch)
            if self.serial:
                self._release(len(batch))

    def _send(self, batch: list[pb.AckItem]) -> None:
        """Send acks, retrying through broker failover for up to one ttr (the lease's life)."""
        deadline_tries = max(int(self.spec.ttr / 0.5), 1)
        for attempt in range(deadline_tries):
            try:
                outcomes = self.client.ack(self.spec.topic, self.registration.node, batch)  # type: ignore[union-attr]
                break
            except RetriableError as exc:
                log.info("ack of %d message(s) failed (%s); retrying", len(batch), exc)
                self._stopping.wait(0.5) if not self._stopping.is_set() else threading.Event().wait(0.5)
        else:
            log.error("gave up acking %d message(s) of %s: they will be delivered again", len(batch), self.spec.topic)
            return
        for item, outcome in zip(batch, outcomes):
            if outcome == pb.STALE:
                self.stale += 1
                log.warning("ack of message %d refused: the lease was lost (it was or will be run elsewhere)", item.id)
            elif item.success:
                self.succeeded += 1
            else:
                self.failed += 1
