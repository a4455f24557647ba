"""Reading what happened in a test: stored messages, their traces, handler logs."""

from __future__ import annotations

import collections
from pathlib import Path

from typing import Optional

from tidemq import trace
from tidemq_broker.storage import MessageFilter


def list_messages(storage, flt: MessageFilter, limit: int, before_id: Optional[int] = None) -> list:
    """Messages matching ``flt``, newest first, below ``before_id``: the console's pages."""
    return storage.console.list_page(flt, limit, before_id).messages


def all_messages(storage, topic: str) -> list:
    """Every stored message of ``topic`` (with its trace), read page by page."""
    found: list = []
    before = None
    while True:
        page = list_messages(storage, MessageFilter(topic=topic), 5000, before)
        if not page:
            return found
        found += page
        before = page[-1].id


def count(storage, topic: str, status: str) -> int:
    """How many messages of ``topic`` are in ``status``."""
    return storage.counts.count_by_status(topic).get(topic, {}).get(status, 0)


def success_records(message) -> int:
    """How many SUCCESS transitions a message's trace records."""
    return sum(1 for entry in trace.parse(message.trace) if entry["event"] == "SUCCESS")


def handler_runs(log: Path) -> collections.Counter:
    """How many times each message id was run to completion, from a "<id> ..." handler log."""
    if not log.exists():
        return collections.Counter()
    return collections.Counter(int(line.split()[0]) for line in log.read_text().splitlines() if line.strip())
