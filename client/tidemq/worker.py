"""A Worker runs every declared consumer until told to stop, then drains."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from .consumer import MAX_CONCURRENCY, ConsumerSpec, registered_consumers
from .coordinator import Coordinator
from .errors import ConfigurationError
from .link import BrokerLink
from .loop import EventLoopThread
from .message import MessageType
from .queue_runner import QueueRunner
from .topic_runner import BroadcastRunner

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Worker", "default_instance"]

log = logging.getLogger(__name__)
Runner = Union[QueueRunner, BroadcastRunner]


def default_instance() -> str:
    """This process's name in consumer nodes: ``<host>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    """Runs consumers: ``Worker().run()`` blocks until SIGTERM or SIGINT, then drains.

    Consumers talk to brokers through ``link`` and register through ``coordinator``; both default
    to ``client``'s (a Client made from the environment when none is given). Tests pass a
    :class:`tidemq.stub.StubBroker` as ``link`` and an in-process coordinator.

    ``async def`` handlers of every consumer run on one event loop thread of this worker;
    ``concurrency`` is how many run at once per consumer that does not set its own.

    ``max_idle`` (seconds): :meth:`run` drains and returns once no consumer has held a message
    for that long (``tidemq worker --max-idle``), so a process manager that starts workers on
    backlog gets idle ones back. A SERIAL_QUEUE consumer standing by (not rank 0) is idle.
    """

    def __init__(self, specs: Optional[Sequence[ConsumerSpec]] = None, client: Optional["Client"] = None,
                 instance: Optional[str] = None, drain_timeout: float = 30.0, *,
                 link: Optional[BrokerLink] = None, coordinator: Optional[Coordinator] = None,
                 concurrency: Optional[int] = None, max_idle: Optional[float] = None) -> None:
        if max_idle is not None and not max_idle > 0:
            raise ConfigurationError(f"max_idle must be a number of seconds above 0, got {max_idle}")
        if concurrency is not None and not 1 <= concurrency <= MAX_CONCURRENCY:  # before a Client is made
            raise ConfigurationError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
        if client is None and link is None:
            from .client import Client  # only here: a Worker given its link needs no gRPC

            client = Client()
            self._own_client = True
        else:
            self._own_client = False
        if coordinator is None and client is None:
            raise ConfigurationError("a Worker given a link also needs its coordinator")
        self.client = client
        self.link: BrokerLink = link if link is not None else client  # type: ignore[assignment]
        self._coordinator = coordinator
        # --concurrency applies to async consumers that did not name theirs; a named batch grows
        # with it, or N tasks would be fed a few at a time (an adaptive one starts at N).
        self.specs = [dataclasses.replace(s, concurrency=concurrency,
                                          batch=None if s.batch is None else min(max(s.batch, concurrency), 1000))
                      if concurrency is not None and s.is_async and s.concurrency is None else s
                      for s in (specs if specs is not None else registered_consumers())]
        self._loop = EventLoopThread("tidemq-loop") if any(s.is_async for s in self.specs) else None
        self.instance = instance or default_instance()
        self.drain_timeout = drain_timeout
        self.max_idle = max_idle
        self.idle_exit = False  # run() returned because of max_idle
        self.runners: list[Runner] = []
        self._stop = threading.Event()

    @property
    def coordinator(self) -> Coordinator:
        """The coordinator consumers register with (the client's, connected on first use)."""
        return (self._coordinator if self._coordinator is not None
                else self.client.coordinator)  # type: ignore[union-attr]

    def start(self) -> "Worker":
        self._declare_schedules()
        coordinator = self.coordinator
        if self._loop is not None:
            self._loop.start()
        for spec in self.specs:
            runner: Runner
            if spec.type is MessageType.TOPIC:
                runner = BroadcastRunner(coordinator, spec, self.instance, loop=self._loop)
            else:
                runner = QueueRunner(self.link, coordinator, spec, self.instance, loop=self._loop)
            runner.start()
            self.runners.append(runner)
            log.info("consuming %s (%s) with %s", spec.topic, spec.type.value, spec.name)
        return self

    def _declare_schedules(self) -> None:
        """Declare the schedules of ``@mq_consumer(..., schedule=...)`` before consuming: a bad
        expression stops the worker at start, with the broker's error naming the expected form."""
        for spec in self.specs:
            if spec.schedule is None:
                continue
            if self.client is None:
                raise ConfigurationError(f"{spec.topic}: declaring a schedule needs a Client "
                                         "(this Worker has a link only)")
            self.client.schedule(spec.topic, spec.topic, spec.schedule, timezone=spec.schedule_timezone)
            log.info("schedule %s (%s, %s) declared", spec.topic, spec.schedule, spec.schedule_timezone)

    def _idle_for(self) -> float:
        """Seconds since any consumer last held a message (0 while one holds any)."""
        if not self.runners:
            return 0.0
        since = [runner.idle_since() for runner in self.runners]
        if any(s is None for s in since):
            return 0.0
        return time.monotonic() - max(s for s in since if s is not None)

    def stop(self) -> None:
        """Stop every consumer, letting running handlers finish and their acks reach a broker,
        all within ``drain_timeout``: what is not done by then is left to its lease (its message
        runs again once the lease expires), so a worker whose brokers are gone still exits."""
        deadline = time.monotonic() + self.drain_timeout
        self._stop.set()
        runners, self.runners = self.runners, []
        for runner in runners:  # every consumer stops taking messages at once
            if isinstance(runner, QueueRunner):
                runner.stop_pulling()
        for runner in runners:
            runner.stop(max(deadline - time.monotonic(), 0.0))
        if self._loop is not None:
            self._loop.stop(max(deadline - time.monotonic(), 0.0))
        if self._own_client and self.client is not None:
            self.client.close()

    def run(self) -> None:
        """Start, wait for SIGTERM/SIGINT, drain, return (main thread only: it sets signal handlers)."""
        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            try:
                self.start()
                while not self._stop.wait(0.5):
                    if self._idle_for() >= (self.max_idle or float("inf")):
                        self.idle_exit = True
                        log.info("no message held for %.0f s (--max-idle): stopping", self.max_idle)
                        break
                log.info("draining %d consumer(s)", len(self.runners))
            finally:  # also when a consumer failed to start: drain the ones that did
                self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
