"""A Worker runs every declared consumer until told to stop, then drains."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Optional, Sequence, Union

from .client import Client
from .consumer import ConsumerSpec, registered_consumers
from .message import MessageType
from .queue_runner import QueueRunner
from .topic_runner import BroadcastRunner

__all__ = ["Worker", "default_instance"]

log = logging.getLogger(__name__)
Runner = Union[QueueRunner, BroadcastRunner]


def default_instance() -> str:
    """This process's name in consumer nodes: ``<host>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    """Runs consumers: ``Worker().run()`` blocks until SIGTERM or SIGINT, then drains."""

    def __init__(self, specs: Optional[Sequence[ConsumerSpec]] = None, client: Optional[Client] = None,
                 instance: Optional[str] = None, drain_timeout: float = 30.0) -> None:
        self.client = client or Client()
        self._own_client = client is None
        self.specs = list(specs if specs is not None else registered_consumers())
        self.instance = instance or default_instance()
        self.drain_timeout = drain_timeout
        self.runners: list[Runner] = []
        self._stop = threading.Event()

    def start(self) -> "Worker":
        for spec in self.specs:
            runner: Runner
            if spec.type is MessageType.TOPIC:
                runner = BroadcastRunner(self.client, spec, self.instance)
            else:
                runner = QueueRunner(self.client, spec, self.instance)
            runner.start()
            self.runners.append(runner)
            log.info("consuming %s (%s) with %s", spec.topic, spec.type.value, spec.name)
        return self

    def stop(self) -> None:
        """Stop every consumer, letting running handlers finish and their acks reach a broker."""
        self._stop.set()
        runners, self.runners = self.runners, []
        for runner in runners:
            runner.stop(self.drain_timeout)
        if self._own_client:
            self.client.close()

    def run(self) -> None:
        """Start, wait for SIGTERM/SIGINT, drain, return."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        while not self._stop.wait(0.5):
            pass
        log.info("draining %d consumer(s)", len(self.runners))
        self.stop()
