"""The group-commit writer: many produce requests, one multi-row INSERT, one transaction.

Produce RPCs call ``write`` and get their ids once committed. The RPCs that arrive while the
broker's commits are busy queue up; the next RPC thread to find a free commit slot inserts
every queued request in one transaction and answers them all (``tidemq.coalesce``). So a
returned produce is durable, an idle broker commits a lone request in its own thread with no
hand-off, and the busier the broker, the larger each commit. A commit also leases what it
inserts to the pulls that wait for it at this broker (``handoff.py``).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from tidemq import clock, tracing
from tidemq.coalesce import Coalescer, Request
from . import metrics
from .errors import StorageUnavailableError, TidemqError, ValidationError, quote
from .handoff import HandOffClaims, open_hand_off
from .hints import Arrival, arrivals
from .storage import MessageWrites, NewRow, RequestRef
from .topics import TopicCache

__all__ = ["GroupCommitWriter"]

log = logging.getLogger(__name__)
_Pending = Request[tuple[Sequence[NewRow], str], list[int]]
#: Data bytes one transaction inserts at most (a single larger request still goes, alone).
_MAX_BYTES = 32 * 1024 * 1024


class GroupCommitWriter:
    """Batches concurrent produce requests into shared transactions (``slots`` at a time)."""

    def __init__(self, messages: MessageWrites, topics: TopicCache, broker: str,
                 on_commit: Optional[Callable[[dict[str, Arrival], list[int]], None]], max_rows: int = 5000,
                 slots: int = 2, pulls: Optional[HandOffClaims] = None) -> None:
        self._messages = messages
        self._pulls = pulls  # the pulls waiting here, which a commit may hand messages to
        self._topics = topics
        self._broker = broker
        self._on_commit = on_commit
        self._coalescer: Coalescer[tuple[Sequence[NewRow], str], list[int]] = Coalescer(
            self._commit, slots, max_rows, _MAX_BYTES, _deadline_passed)

    def write(self, rows: Sequence[NewRow], timeout: Optional[float] = None, request_id: str = "") -> list[int]:
        """Insert ``rows`` (all or nothing) and return their ids once committed.

        ``timeout`` bounds the wait for a commit slot; a commit once started runs to its end.
        ``request_id`` (the client's name for its call): a retry of a committed call returns
        the first answer's ids and stores nothing.
        """
        return self._coalescer.submit((rows, request_id), len(rows), sum(len(row.data) for row in rows), timeout)

    @property
    def commits(self) -> int:
        """Group commits made so far, each carrying one or more requests (tests read it)."""
        return self._coalescer.flushes

    def stop(self) -> None:
        """Refuse new rows; requests already queued are still committed by their callers."""
        self._coalescer.close(
            lambda: StorageUnavailableError("the broker is shutting down; produce to another broker"))

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            contexts = (row.trace_context or "" for request in batch for row in request.payload[0])
            with tracing.commit_span(sum(request.items for request in batch), len(batch), contexts):
                self._write(batch)
        except StorageUnavailableError as exc:
            for request in batch:
                request.error = exc
        except Exception as exc:
            if len(batch) == 1:
                if not isinstance(exc, ValidationError):  # the caller's input: its error says it all
                    log.exception("produce failed")
                # A database error's own text, never SQLAlchemy's, which carries the statement
                # and with it the rows' data (the log above has the whole of it).
                reason = quote(getattr(exc, "orig", None) or exc, limit=200)
                batch[0].error = exc if isinstance(exc, TidemqError) else TidemqError(f"produce failed: {reason}")
                return
            # One request's rows broke the shared transaction: commit each request on its own
            # so the others are not refused for it.
            for request in batch:
                self._commit([request])

    def _write(self, batch: list[_Pending]) -> None:
        all_rows = [row for request in batch for row in request.payload[0]]
        refs, start = [], 0
        for request in batch:
            rows, request_id = request.payload
            if request_id:
                refs.append(RequestRef(request_id, start, len(rows)))
            start += len(rows)
        topics = {row.topic for row in all_rows}
        self._topics.ensure(topics)
        now = clock.now()
        handoff = open_hand_off(self._pulls, topics, now)
        committed = False
        try:
            ids = self._messages.insert_messages(all_rows, now, refs, handoff=handoff, broker=self._broker)
            committed = True
            metrics.committed(all_rows)
            start = 0
            for request in batch:
                request.result = ids[start : start + request.items]
                start += request.items
            if self._on_commit is not None:  # None: no pull to wake in this process (direct)
                try:
                    self._on_commit(arrivals((row.topic, row.priority, row.effect_time) for row in all_rows), ids)
                except Exception:  # committed and answered: a failed wake-up must not undo that
                    log.exception("commit notification failed")
        finally:
            if handoff is not None:  # after the notifications (``PullHub.settle``)
                handoff.finish(committed)


def _deadline_passed(timeout: float) -> StorageUnavailableError:
    return StorageUnavailableError(f"no commit slot came free within the call's deadline ({timeout:.1f} s)")
