"""Which messages were committed since the last look, by anyone but this broker.

A broker hears of its own commits from its writer. Messages stored elsewhere (through another
broker, or by ``tidemq.enqueue`` in an application's transaction) it learns of by looking: the
pull hub calls ``InsertWatch.look`` every probe interval while pulls wait.

Ids are handed out when a row is inserted, not when it commits, so they do not become visible
in order: an application transaction that enqueued id 100 may commit after a broker committed
id 101. A high-water mark alone (``MAX(id)``) would never see id 100. The watch therefore reads
the rows above its mark and remembers the ids it skipped over (the gaps) for a while; each look
reads those ids again, and a gap that fills is a late commit. The query walks the primary key
from the mark and picks the gap ids by key.

Not every skipped id can fill. On a Galera cluster of n nodes (``auto_increment_increment`` n)
each node hands out ids of one remainder modulo n, so with one writer node two ids in three
never exist. The watch therefore keeps as gaps only the skipped ids whose remainder modulo the
server's step is one that committed ids were seen with in the last ``residue_ttl`` seconds;
with a step of 1 (one server) every skipped id is a gap.

A gap is forgotten after ``gap_ttl`` seconds (rolled-back transactions, duplicate unique keys
and deleted messages leave gaps that never fill) and the oldest go first beyond ``max_gaps``.
A transaction that commits later than that is found by the hub's slower earliest-due probe.

Ids can also go backwards: a TRUNCATE resets the counter and a restore brings back an older
table, so new rows get ids below the mark and a walk above it would never see them. Each look
therefore reads the table's highest id in the same statement; when it is below the mark, the
watch starts again from it and wakes every waiting pull once.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Optional, Sequence

from .hints import Arrival, arrivals
from .storage import Probes, RecentInserts

__all__ = ["InsertWatch"]

log = logging.getLogger(__name__)

_MAX_OWN = 100_000  # own ids remembered at most; forgetting them costs only a needless wake-up


class InsertWatch:
    """Reads the messages committed since the last look and the ids that were missing then."""

    def __init__(self, probes: Probes, limit: int = 500, gap_ttl: float = 30.0, max_gaps: int = 512,
                 residue_ttl: float = 60.0, step_every: float = 10.0, pages: int = 20) -> None:
        self._probes = probes
        self._limit = limit
        self._pages = pages
        self._gap_ttl = gap_ttl
        self._max_gaps = max_gaps
        self._residue_ttl = residue_ttl
        self._step_every = step_every
        self._step = 1
        self._step_read = float("-inf")  # when the server's id step was last read
        self._residues: dict[int, float] = {}  # id % step of committed ids -> when last seen
        self._mark: Optional[int] = None  # the highest id seen; None before the first look
        self._gaps: dict[int, float] = {}  # id not seen below the mark -> when it was first missed
        self._own: set[int] = set()
        self._lock = threading.Lock()

    def committed_here(self, ids: Sequence[int]) -> None:
        """This broker's writer committed ``ids``: its waiters were told already."""
        with self._lock:
            if len(self._own) + len(ids) > _MAX_OWN:
                self._own.clear()
            self._own.update(ids)

    @property
    def step(self) -> int:
        """The server's id step as last read (1 before the first read): see ``pulls._holds``."""
        return self._step

    @property
    def gaps(self) -> int:
        """How many ids the watch is waiting to see committed."""
        return len(self._gaps)

    def look(self) -> Optional[dict[str, Arrival]]:
        """{topic: Arrival} of the messages committed elsewhere since the last look.

        A look reads ``limit`` rows a statement, and reads on while a statement comes back full
        (up to ``pages`` statements): a look that came late (while the earliest-due probe ran
        long, or while no pull waited) reads what piled up instead of giving up on it.

        None means "assume anything": the first look, more rows arrived than ``pages`` reads
        (the watch then skips to the newest id), or the ids went backwards. The caller wakes
        every waiting pull then, and forgets what its locks know of every topic.
        """
        if self._mark is None:
            self._mark = self._probes.max_id()
            return None
        found: list[tuple[str, int, datetime]] = []
        now = time.monotonic()
        for _ in range(self._pages):
            probe = self._probes.recent_inserts(self._mark, sorted(self._gaps), self._limit)
            if probe.top < self._mark:
                return self._restart(probe.top)
            if self._take(probe, found, now) < self._limit:
                self._forget(now)
                return arrivals(found)
        # Rows arrive faster than the looks read: wake everyone and move on to the newest.
        self._mark = max(self._mark, probe.top)
        self._forget(now)
        return None

    def _take(self, probe: RecentInserts, found: list[tuple[str, int, datetime]], now: float) -> int:
        """Add the rows of one statement committed elsewhere to ``found``, record the ids it
        skipped as gaps and move the mark to the highest id read. Returns how many it read."""
        fresh: list[int] = []
        read = 0
        with self._lock:
            for topic, priority, when, ids in probe.groups:
                read += len(ids)
                elsewhere = False
                for id in ids:
                    self._gaps.pop(id, None)
                    if id > self._mark:
                        fresh.append(id)
                    if id in self._own:
                        self._own.discard(id)
                    else:
                        elsewhere = True
                if elsewhere:
                    # The group's earliest time may be of a row committed here: at worst its
                    # waiters lock once more than they had to.
                    found.append((topic, priority, when))
        fresh.sort()
        if now - self._step_read > self._step_every:
            self._step, self._step_read = max(1, self._probes.id_step()), now
        for id in fresh:
            self._residues[id % self._step] = now
        previous = self._mark
        for id in fresh:  # in id order: each id skipped since the previous one may be a gap
            self._miss(range(max(previous + 1, id - self._max_gaps * self._step), id), now)
            previous = id
        # A full statement read the lowest ids above the mark: the ids above the last one read
        # are not gaps, only not read yet.
        self._mark = previous
        return read

    def _restart(self, top: int) -> None:
        """The table's highest id fell below the mark: ids went backwards (a TRUNCATE reset the
        counter, a restore, or the newest rows were deleted). Rows at or below the mark may be
        new now, and the watch cannot tell which: start again from ``top`` and return None, so
        every waiting pull locks once and finds whatever is due."""
        log.info("message ids went back from %d to %d (a TRUNCATE, a restore or deleted newest rows): "
                 "watching from %d", self._mark, top, top)
        self._mark = top
        self._gaps.clear()
        self._residues.clear()
        with self._lock:
            self._own.clear()
        return None

    def _miss(self, ids: range, now: float) -> None:
        """Remember the ids of ``ids`` that a writer seen lately could still commit."""
        live = {r for r, seen in self._residues.items() if now - seen <= self._residue_ttl}
        for id in ids:
            if id % self._step in live:
                self._gaps.setdefault(id, now)

    def _forget(self, now: float) -> None:
        """Drop gaps older than the ttl, the oldest beyond the cap, and own ids seen already."""
        old = [id for id, since in self._gaps.items() if now - since > self._gap_ttl]
        for id in old:
            del self._gaps[id]
        if len(self._gaps) > self._max_gaps:
            for id in sorted(self._gaps)[: len(self._gaps) - self._max_gaps]:
                del self._gaps[id]
        mark = self._mark or 0
        with self._lock:
            self._own = {id for id in self._own if id > mark or id in self._gaps}
