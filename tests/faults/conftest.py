"""Helpers shared by the fault tests."""

from __future__ import annotations

import collections
from pathlib import Path

from tidemq_broker import trace
from tidemq_broker.storage import MessageFilter


def all_messages(storage, topic):
    """Every stored message of ``topic`` (keyset pages)."""
    found, last = [], None
    while True:
        page = storage.list_messages(MessageFilter(topic=topic), 5000, last)
        if not page:
            return found
        found += page
        last = page[-1].id


def handler_runs(log: Path) -> collections.Counter:
    """How many times each message id was run to completion, from a handler log."""
    if not log.exists():
        return collections.Counter()
    return collections.Counter(int(line.split()[0]) for line in log.read_text().splitlines() if line.strip())


def success_records(message) -> int:
    """How many SUCCESS transitions a message's trace records."""
    return sum(1 for entry in trace.parse(message.trace) if entry["event"] == "SUCCESS")
