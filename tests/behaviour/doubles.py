"""The two doubles the behaviour scenarios run against, behind one small interface.

``StubDouble``: :class:`tidemq.stub.StubBroker`, on a clock that runs with the wall clock and
jumps forward when a scenario lets leases run out. ``EmbeddedDouble``: a real broker on SQLite
with in-process coordination, in this process, reached through a real :class:`tidemq.Client`
over gRPC, as ``tidemq dev`` runs it (``tidemq_cli.embedded``).

Scenarios produce, pull, ack, release, extend, cancel and requeue through ``link`` (the stub and
the client take the same calls), and use the double itself only for what an application cannot
do: change a topic's settings, read a stored message, let leases run out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from tests.servers import wait_until
from tidemq import clock, trace
from tidemq.stub import StubBroker
from tidemq.stub_types import stored_time

__all__ = ["Stored", "StubDouble", "EmbeddedDouble"]


@dataclass(frozen=True)
class Stored:
    """A stored message as a scenario reads it; times naive UTC as the broker stores them."""

    status: str
    attempt: int
    retry_remaining: int
    effect_time: datetime
    lease_expire: Optional[datetime]
    events: tuple[str, ...]  # the events of its trace lines, in order
    errors: tuple[str, ...]  # the error fields of its trace lines


def _stored(status: str, attempt: int, retry_remaining: int, effect_time: datetime,
            lease_expire: Optional[datetime], trace_text: str) -> Stored:
    lines = trace.parse(trace_text)
    return Stored(status, attempt, retry_remaining, effect_time, lease_expire,
                  tuple(line["event"] for line in lines), tuple(line["error"] for line in lines if "error" in line))


class StubDouble:
    """The StubBroker: the consumers' unit-test double."""

    name = "stub"

    def __init__(self) -> None:
        self._offset = 0.0
        self.link = self.stub = StubBroker(clock=lambda: time.time() + self._offset)

    def now(self) -> datetime:
        return stored_time(self.stub.clock())

    def set_topic(self, topic: str, **settings: Any) -> None:
        self.stub.set_topic(topic, **settings)

    def stored(self, msg_id: int) -> Optional[Stored]:
        if msg_id not in self.stub.ids():
            return None
        m = self.stub.message(msg_id)
        return _stored(m.status, m.attempt, m.retry_remaining, stored_time(m.effect_time),
                       stored_time(m.lease_expire) if m.lease_expire else None, m.trace)

    def run_out_leases(self, ids: list[int]) -> None:
        """The leases of ``ids`` run out (the clock jumps past the last), then lease expiry runs."""
        last = max(self.stub.message(i).lease_expire for i in ids)
        self._offset += max(last - self.stub.clock(), 0.0) + 0.01
        self.stub.expire_leases()

    def close(self) -> None:
        pass


class EmbeddedDouble:
    """A real broker (SQLite, in-process coordination) and a real client of it."""

    name = "embedded"

    def __init__(self, db_path: Path) -> None:
        from tidemq_broker.maintenance.leases import LeaseExpiry
        from tidemq_cli.embedded import embedded

        self.broker, self.link = embedded(str(db_path))
        broker = self.broker
        # The leader runs this job every 0.5 s too; a scenario runs it when it needs it done.
        self._expiry = LeaseExpiry(broker.storage.leases, broker.address, broker.hub.wake_all,
                                   lambda topic: broker.topics.get(topic).max_deliveries)

    def now(self) -> datetime:
        return clock.now()

    def set_topic(self, topic: str, **settings: Any) -> None:
        self.broker.storage.topics.save_topic(replace(self.broker.topics.get(topic), **settings), clock.now())
        self.broker.topics.refresh()

    def stored(self, msg_id: int) -> Optional[Stored]:
        m = self.broker.storage.reads.get_message(msg_id)
        if m is None:
            return None
        return _stored(m.status, m.attempt, m.retry_remaining, m.effect_time, m.lease_expire, m.trace)

    def run_out_leases(self, ids: list[int]) -> None:
        """Wait until the leases of ``ids`` have run out (a broker leases whole seconds), then run
        lease expiry."""
        last = max(m.lease_expire for m in map(self.broker.storage.reads.get_message, ids) if m and m.lease_expire)
        wait_until(lambda: clock.now() > last, (last - clock.now()).total_seconds() + 5, 0.01,
                   what="the leases to run out")
        self._expiry.run()

    def close(self) -> None:
        self.link.close()
        self.broker.stop(grace=1)
        self.broker.coordinator.stop()  # embedded() made it for the broker and the client

