"""Leader-only maintenance: one broker at a time (elected through the coordinator) runs these.

Each job lives in its own module and has ``interval`` (seconds) and ``run() -> int`` (how much it
did), and may have ``stop_leading()``, called when leadership ends. Jobs work in small batches so
that no transaction holds locks for long.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, Protocol, Sequence

from tidemq.coordinator import Coordinator

from ..errors import RetriableError

__all__ = ["Job", "Maintainer"]

log = logging.getLogger(__name__)


class Job(Protocol):
    """A periodic maintenance job."""

    name: str
    interval: float

    def run(self) -> int:
        """Do one round; return how many items it handled."""


class Maintainer:
    """Campaigns for leadership and, while leader, runs each job on its interval."""

    def __init__(self, coordinator: Coordinator, identifier: str, jobs: Sequence[Job], tick: float = 0.2) -> None:
        self._coordinator = coordinator
        self._identifier = identifier
        self._jobs = list(jobs)
        self._tick = tick
        self._end: Optional[Callable[[], None]] = None
        self.is_leader = threading.Event()

    def start(self) -> None:
        self._end = self._coordinator.run_for_leader(self._identifier, self._lead)

    def stop(self) -> None:
        if self._end is not None:
            self._end()

    def _lead(self, lost: threading.Event) -> None:
        log.info("%s is the maintenance leader", self._identifier)
        self.is_leader.set()
        next_run = {job.name: 0.0 for job in self._jobs}
        try:
            while not lost.is_set():
                for job in self._jobs:
                    if lost.is_set() or time.monotonic() < next_run[job.name]:
                        continue
                    try:
                        done = job.run()
                        if done:
                            log.info("maintenance %s handled %d", job.name, done)
                    except RetriableError as exc:  # the database or ZooKeeper away: each logs its outage once
                        log.debug("maintenance job %s failed: %s", job.name, exc)
                    except Exception:  # a failing job must not end the leadership
                        log.warning("maintenance job %s failed", job.name, exc_info=True)
                    next_run[job.name] = time.monotonic() + job.interval
                lost.wait(self._tick)
        finally:
            self.is_leader.clear()
            for job in self._jobs:
                stop_leading = getattr(job, "stop_leading", None)
                if stop_leading is not None:  # a job holding leader-only state (the backlog gauges)
                    stop_leading()
            log.info("%s is no longer the maintenance leader", self._identifier)
