"""A broker's own Prometheus counters, read around a measurement.

The concurrency scenario splits a brokered call by where its time goes: what the broker spent
on each Produce (from its arrival to its commit) and how many rows each group commit carried are
the broker's histograms (``tidemq_produce_duration_seconds``, ``tidemq_group_commit_rows``); the
call as the client saw it is the scenario's own clock. Counting INSERT statements on MariaDB's
side cannot tell rows per commit: a group commit also inserts its request ids.
"""

from __future__ import annotations

import urllib.request
from typing import Iterable

__all__ = ["read", "PRODUCE"]

#: The samples a Produce split needs: seconds and calls, rows and group commits.
PRODUCE = ("tidemq_produce_duration_seconds_sum", "tidemq_produce_duration_seconds_count",
           "tidemq_group_commit_rows_sum", "tidemq_group_commit_rows_count")


def read(port: int, names: Iterable[str] = PRODUCE) -> dict[str, float]:
    """The samples ``names`` of the endpoint on ``port``, each summed over its label sets (0 when
    absent: a histogram nothing observed yet is still listed, a labelled counter is not)."""
    wanted = set(names)
    found = dict.fromkeys(wanted, 0.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sample, _, value = line.rpartition(" ")  # a label value may hold spaces; the value cannot
        name = sample.split("{", 1)[0]
        if name in wanted:
            found[name] += float(value)
    return found
