"""Prometheus metrics of a broker: what it stores, leases and expires, how long that takes, and
(on the maintenance leader only) the backlog of every topic.

Counters and histograms are updated where the work happens (the writer, the service, the lease
expiry job). The backlog gauges come from ``BACKLOG``, a collector that reports the last
snapshot the leader's ``BacklogRefresh`` job read with one grouped query every few seconds: a
scrape never touches the database, and a broker that is not (or no longer) the leader exports
no backlog gauges at all, so ``sum by (topic)`` over all brokers counts each topic once.
Worker-side metrics and the HTTP endpoint are in ``tidemq.metrics``.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence

from tidemq.clock import to_epoch_ms
from tidemq.metrics import AVAILABLE, child, counter, histogram

from .storage import AckItem, AckOutcome, Backlog, NewRow

__all__ = ["BACKLOG", "BacklogCollector", "DELIVERED", "HANDED_OFF", "GROUP_COMMIT_ROWS", "LEASE_EXPIRED",
           "LOCK_SECONDS", "PRODUCED", "PRODUCE_SECONDS", "PROGRESS_REPORTS", "RESULTS_STORED", "WORKFLOWS_FINISHED",
           "committed", "count_results", "expired", "workflows_finished"]

#: Seconds: a produce waits for its commit (about a millisecond idle, more under load).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Rows per group commit: 1 when idle, up to the writer's 5,000-row cap.
ROWS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)

PRODUCED = counter("tidemq_messages_produced", "Messages in produce calls this broker committed (a call "
                   "answered from its request id or a unique_key already stored counts again).", ("topic",))
DELIVERED = counter("tidemq_messages_delivered", "Messages this broker leased to consumers (each delivery of "
                    "a retried or expired message counts again).", ("topic",))
HANDED_OFF = counter("tidemq_messages_handed_off", "Of the deliveries, those the commit that made them due leased "
                     "to a pull waiting at this broker, without a lock of the pull's own.", ("topic",))
LEASE_EXPIRED = counter("tidemq_messages_lease_expired", "Leases the maintenance leader found expired (the "
                        "consumer died or hung): back to NEW, or FAIL at max_deliveries.", ("topic",))
PRODUCE_SECONDS = histogram("tidemq_produce_duration_seconds", "Seconds a Produce RPC took in the broker, from "
                            "its arrival to its commit.", LATENCY_BUCKETS)
GROUP_COMMIT_ROWS = histogram("tidemq_group_commit_rows", "Rows per group commit (one transaction of one or "
                              "more produce calls).", ROWS_BUCKETS)
LOCK_SECONDS = histogram("tidemq_lock_duration_seconds", "Seconds one lock transaction of a pull took "
                         "(the conditional UPDATE and the read of the leased rows).", LATENCY_BUCKETS)
RESULTS_STORED = counter("tidemq_results_stored", "Results this broker stored with an applied ack, by outcome: "
                         "success (a return value), failure (an error) or cancelled.", ("outcome",))
PROGRESS_REPORTS = counter("tidemq_progress_reports", "Progress reports this broker received with heartbeats.")
WORKFLOWS_FINISHED = counter("tidemq_workflows_finished", "Workflows this broker's transactions ended (the one "
                             "that ended a workflow's last step), by state: SUCCEEDED, FAILED or CANCELLED.",
                             ("state",))


def count_results(items: Sequence[AckItem], outcomes: Sequence[AckOutcome]) -> None:
    """Count the results and cancellations among applied acks."""
    tally = Tally("cancelled" if item.cancelled else "success" if item.success else "failure"
                  for item, outcome in zip(items, outcomes)
                  if outcome is AckOutcome.APPLIED and (item.result is not None or item.cancelled))
    for outcome, n in tally.items():
        child(RESULTS_STORED, outcome).inc(n)


def workflows_finished(by_state: Mapping[str, int]) -> None:
    """Count the workflows one committed transaction ended, per state (the storage calls it)."""
    for state, n in by_state.items():
        child(WORKFLOWS_FINISHED, state).inc(n)


def committed(rows: Sequence[NewRow]) -> None:
    """Count the rows of one group commit, per topic and as one batch."""
    GROUP_COMMIT_ROWS.observe(len(rows))
    for topic, n in Tally(row.topic for row in rows).items():
        child(PRODUCED, topic).inc(n)


def expired(by_topic: dict[str, int]) -> None:
    """Count leases the lease-expiry job moved, per topic."""
    for topic, n in by_topic.items():
        child(LEASE_EXPIRED, topic).inc(n)


class BacklogCollector:
    """The per-topic backlog gauges, from the snapshot its owner (the leader) last published.

    ``publish`` replaces the whole snapshot at once, so a scrape sees one consistent reading;
    ``withdraw`` (leadership lost) removes them. Several brokers in one process (tests) share
    the collector: only the one that published may withdraw.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: Optional[str] = None
        self._rows: list[Backlog] = []
        self._at: Optional[datetime] = None

    def publish(self, owner: str, rows: Sequence[Backlog], now: datetime) -> None:
        with self._lock:
            self._owner, self._rows, self._at = owner, list(rows), now

    def withdraw(self, owner: str) -> None:
        with self._lock:
            if self._owner == owner:
                self._owner, self._rows, self._at = None, [], None

    def describe(self) -> Iterable[Any]:
        return []  # the families vary with the topics: nothing to check at registration

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            rows, at, owner = self._rows, self._at, self._owner
        if owner is None:
            return
        due = GaugeMetricFamily("tidemq_backlog_due_messages", "NEW messages whose effect_time has come: waiting "
                                "for a consumer.", labels=["topic"])
        scheduled = GaugeMetricFamily("tidemq_backlog_scheduled_messages", "NEW messages not yet due (delayed or "
                                      "waiting for a retry).", labels=["topic"])
        running = GaugeMetricFamily("tidemq_running_messages", "RUNNING messages: leased to a consumer.",
                                    labels=["topic"])
        oldest = GaugeMetricFamily("tidemq_oldest_due_age_seconds", "Seconds since the effect_time of the oldest "
                                   "due NEW message (0 when none is due), as of the last refresh.", labels=["topic"])
        refreshed = GaugeMetricFamily("tidemq_backlog_refresh_timestamp_seconds", "Unix time of the leader's "
                                      "last backlog reading (exported by the maintenance leader only).")
        if at is not None:
            refreshed.add_metric([], to_epoch_ms(at) / 1000)
        for row in rows:
            due.add_metric([row.topic], row.due)
            scheduled.add_metric([row.topic], row.scheduled)
            running.add_metric([row.topic], row.running)
            age = (at - row.oldest_due).total_seconds() if at is not None and row.oldest_due is not None else 0.0
            oldest.add_metric([row.topic], max(age, 0.0))
        yield from (due, scheduled, running, oldest, refreshed)


BACKLOG = BacklogCollector()
if AVAILABLE:
    import prometheus_client

    prometheus_client.REGISTRY.register(BACKLOG)
