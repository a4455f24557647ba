"""Produce load for the fault tests, and the checks every kill test makes afterwards."""

from __future__ import annotations

import collections
import json
import threading

from tests.observe import all_messages, handler_runs, success_records
from tests.servers import wait_until
from tidemq.errors import TidemqError

__all__ = ["ProduceLoad", "check_outcome"]


class ProduceLoad:
    """A thread calling ``produce_many`` with 50 numbered messages per call until stopped.

    ``acked`` holds the ids of acknowledged calls; a call that failed is counted in ``failed``
    and may be lost, never counted as sent."""

    def __init__(self, client, topic: str, timeout: float) -> None:
        self.client, self.topic, self.timeout = client, topic, timeout
        self.acked: list[int] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="produce-load")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.acked.extend(self.client.produce_many(self.topic, [{"n": n + i} for i in range(50)],
                                                           timeout=self.timeout))
            except TidemqError:
                self.failed += 1
            n += 50

    def start(self) -> "ProduceLoad":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)


def check_outcome(storage, topic: str, acked: list[int], log) -> str:
    """Wait until every acknowledged message succeeded, then assert none was lost, stored twice
    (the same ``n`` in two rows) or recorded SUCCESS twice; return the figures as a line."""

    def settled():
        counts = storage.count_by_status(topic).get(topic, {})
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
