"""The group-commit writer: many produce requests, one multi-row INSERT, one transaction.

Produce RPCs hand their rows to ``submit`` and wait on the returned future. A writer thread
takes everything queued (up to ``max_rows``), inserts it in one transaction and resolves each
future only after the commit, so a returned produce is durable. While one transaction runs, the
next batch gathers: the busier the broker, the larger each commit.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from datetime import datetime
from typing import Callable, Optional, Sequence

from tidemq import clock
from .errors import StorageUnavailableError, TidemqError
from .storage import NewRow, Storage
from .topics import TopicCache

__all__ = ["GroupCommitWriter"]

log = logging.getLogger(__name__)
_Request = tuple[Sequence[NewRow], "Future[list[int]]"]


class GroupCommitWriter:
    """Batches produce requests into shared transactions."""

    def __init__(self, storage: Storage, topics: TopicCache, broker: str,
                 on_commit: Callable[[dict[str, datetime], int], None], max_rows: int = 5000,
                 threads: int = 2) -> None:
        self._storage = storage
        self._topics = topics
        self._broker = broker
        self._on_commit = on_commit
        self._max_rows = max_rows
        self._queue: "queue.Queue[Optional[_Request]]" = queue.Queue()
        self._threads = [threading.Thread(target=self._run, name=f"tidemq-writer-{i}", daemon=True) for i in range(threads)]
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def submit(self, rows: Sequence[NewRow]) -> "Future[list[int]]":
        """Queue ``rows`` (all or nothing); the future gives their ids once committed."""
        future: "Future[list[int]]" = Future()
        with self._lock:
            if self._closed:
                future.set_exception(StorageUnavailableError("the broker is shutting down; produce to another broker"))
                return future
            self._queue.put((rows, future))
        return future

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new rows, commit everything queued, then stop the threads."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            rows = len(first[0])
            while rows < self._max_rows:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # leave the stop signal for after this batch
                    break
                batch.append(item)
                rows += len(item[0])
            self._commit(batch)

    def _commit(self, batch: list[_Request]) -> None:
        try:
            self._write(batch)
        except StorageUnavailableError as exc:
            for _, future in batch:
                future.set_exception(exc)
        except Exception as exc:
            if len(batch) == 1:
                log.exception("produce failed")
                batch[0][1].set_exception(exc if isinstance(exc, TidemqError) else TidemqError(f"produce failed: {exc!r}"))
                return
            # One request's rows broke the shared transaction: commit each request on its own
            # so the others are not refused for it.
            for request in batch:
                self._commit([request])

    def _write(self, batch: list[_Request]) -> None:
        all_rows = [row for rows, _ in batch for row in rows]
        self._topics.ensure({row.topic for row in all_rows})
        now = clock.now()
        ids = self._storage.insert_messages(all_rows, now, broker=self._broker)
        start = 0
        for rows, future in batch:
            future.set_result(ids[start : start + len(rows)])
            start += len(rows)
        earliest: dict[str, datetime] = {}
        for row in all_rows:
            if row.topic not in earliest or row.effect_time < earliest[row.topic]:
                earliest[row.topic] = row.effect_time
        self._on_commit(earliest, max(ids))
