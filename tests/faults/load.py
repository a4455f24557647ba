"""Produce load for the fault tests, and the checks every kill test makes afterwards."""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import NamedTuple, Optional

from tests.observe import all_messages, handler_runs, success_records
from tests.servers import wait_until
from tidemq.errors import RetriableError, TidemqError

__all__ = ["Call", "ProduceLoad", "check_calls", "check_outcome"]


class Call(NamedTuple):
    """One produce call: when it started (``time.monotonic()``), how long it took, its error."""

    start: float
    duration: float
    error: Optional[TidemqError]


class ProduceLoad:
    """A thread calling ``produce_many`` with 50 numbered messages per call until stopped.

    ``acked`` holds the ids of acknowledged calls; a call that failed is counted in ``failed``
    and may be lost, never counted as sent. ``calls`` records every call. After a failed call
    the thread pauses ``pause`` seconds, as a producer backing off would; ``every`` (seconds)
    spaces the calls' starts, so the offered rate stays below what the consumers take."""

    def __init__(self, client, topic: str, timeout: float, pause: float = 0.05, every: float = 0.0) -> None:
        self.client, self.topic, self.timeout, self.pause, self.every = client, topic, timeout, pause, every
        self.acked: list[int] = []
        self.calls: list[Call] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="produce-load")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.acked.extend(self.client.produce_many(self.topic, [{"n": n + i} for i in range(50)],
                                                           timeout=self.timeout))
                self.calls.append(Call(started, time.monotonic() - started, None))
            except TidemqError as exc:
                self.calls.append(Call(started, time.monotonic() - started, exc))
                self.failed += 1
                self._stop.wait(self.pause)
            n += 50
            self._stop.wait(started + self.every - time.monotonic())

    def start(self) -> "ProduceLoad":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)

    def succeeded_since(self, moment: float) -> int:
        """How many calls started after ``moment`` (monotonic) succeeded."""
        return sum(1 for call in list(self.calls) if call.error is None and call.start > moment)

    def failed_since(self, moment: float) -> int:
        """How many calls started after ``moment`` (monotonic) failed."""
        return sum(1 for call in list(self.calls) if call.error is not None and call.start > moment)


def check_calls(load: ProduceLoad, slack: float = 2.0) -> str:
    """Assert every failed call failed with a retriable error and no call outlived its deadline
    (plus ``slack`` for scheduling on a loaded 2-core machine); return the figures."""
    errors = [call.error for call in load.calls if call.error is not None]
    slowest = max((call.duration for call in load.calls), default=0.0)
    kinds = sorted({type(error).__name__ for error in errors})
    wrong = sorted({repr(error)[:300] for error in errors if not isinstance(error, RetriableError)})
    assert not wrong, f"non-retriable produce errors: {wrong[:3]}"
    assert slowest < load.timeout + slack, f"a produce call took {slowest:.1f} s (deadline {load.timeout} s)"
    return f"failed produce calls {len(errors)} {kinds}, slowest call {slowest:.2f} s (deadline {load.timeout} s)"


def check_outcome(storage, topic: str, acked: list[int], log) -> str:
    """Wait until every acknowledged message succeeded, then assert none was lost, stored twice
    (the same ``n`` in two rows) or recorded SUCCESS twice; return the figures as a line."""

    def settled():
        counts = storage.counts.count_by_status(topic).get(topic, {})
        return counts.get("SUCCESS", 0) >= len(set(acked)) and not counts.get("NEW") and not counts.get("RUNNING")

    wait_until(settled, 180, 0.2, "every acknowledged message to succeed")
    messages = {m.id: m for m in all_messages(storage, topic)}
    lost = set(acked) - set(messages)
    twice = [i for i, m in messages.items() if success_records(m) > 1]
    copies = collections.Counter(json.loads(m.data)["n"] for m in messages.values())
    stored_twice = sorted(n for n, k in copies.items() if k > 1)
    runs = handler_runs(log)
    reruns = sum(n - 1 for n in runs.values() if n > 1)
    figures = (f"acked {len(acked)}, stored {len(messages)}, lost {len(lost)}, stored twice {len(stored_twice)}, "
               f"two SUCCESS records {len(twice)}, handler re-runs {reruns}")
    assert not lost, f"{len(lost)} acknowledged messages lost"
    assert not stored_twice, f"messages stored twice: {stored_twice[:5]}"
    assert not twice, f"messages with two SUCCESS records: {twice[:5]}"
    assert all(m.status == "SUCCESS" for m in messages.values())
    assert set(runs) >= set(acked)
    return figures
