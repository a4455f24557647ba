"""The raw limits: what PyMySQL alone gets out of the same table, with no tidemq in the way.

These are the baselines of the ratios, so they are written the way a careful hand-rolled queue
would be: multi-row INSERTs, and a consume loop of "lock 500 due rows with one conditional
UPDATE, read them back, mark them SUCCESS". The SQL here is the benchmark's
own yardstick, not a second storage layer; tidemq itself only speaks SQL in tidemq_broker.
They also load the large fixtures (1 M pending rows) faster than a broker would.
"""

from __future__ import annotations

import functools
import json
import queue
import threading
import time
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Callable, Optional
from urllib.parse import urlparse

import pymysql

from tidemq import clock, lifecycle, trace
from tidemq_broker.storage import NewRow
from tidemq_broker.storages.rows import INSERT_COLUMNS, insert_columns, row_values

__all__ = ["connect", "payload", "insert_rate", "load", "consume_rate", "commit_latency", "truncate", "Watch", "span",
           "finish_times", "make_due", "Row", "RowCommitter", "GroupCommitter"]

Row = tuple
_COLS = ", ".join(INSERT_COLUMNS)
_ROW = "(" + ", ".join(["%s"] * len(INSERT_COLUMNS)) + ")"


def connect(url: str) -> pymysql.connections.Connection:
    """A PyMySQL connection to the database of a ``mysql+pymysql://`` URL."""
    from tidemq_broker.storages.failover import split_addresses

    url, _ = split_addresses(url)  # a cluster's URL: its first node, the one the brokers write through
    u = urlparse(url.replace("mysql+pymysql://", "mysql://"))
    return pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username or "root",
                           password=u.password or "", database=u.path.lstrip("/"), charset="utf8mb4",
                           autocommit=False)


def payload(i: int) -> str:
    """The message data every scenario uses: a small JSON object (about 60 bytes)."""
    return json.dumps({"i": i, "body": "benchmark-payload-" + "x" * 24}, separators=(",", ":"))


def _row(topic: str, i: int, effect_time: datetime, now: datetime, line: str) -> Row:
    # The broker's own row builder with the lifecycle's produce change: the same column values a
    # broker writes for a message produced without options, whatever columns the table gains.
    values = row_values(NewRow(topic, payload(i), effect_time, 0), _produced(now, line))
    return tuple(values[c] for c in INSERT_COLUMNS)


@functools.lru_cache(maxsize=4)
def _produced(now: datetime, line: str) -> dict[str, Any]:
    """The INSERT columns of the lifecycle's produce change at ``now`` with the loader's trace
    ``line`` (one per batch), made once as the broker makes them once per call."""
    return insert_columns(replace(lifecycle.produce(now), trace=line))


def _insert(cur, rows: list[Row]) -> None:
    cur.execute(f"INSERT INTO tidemq_message ({_COLS}) VALUES " + ", ".join([_ROW] * len(rows)),
                [v for row in rows for v in row])


def insert_rate(url: str, topic: str, total: int, threads: int, per_statement: int = 100) -> float:
    """Rows/s of ``threads`` connections each committing multi-row INSERTs of ``per_statement``."""
    per_thread = total // threads
    errors: list[BaseException] = []
    start_line = threading.Barrier(threads + 1)

    def run(k: int) -> None:
        conn = connect(url)
        try:
            with conn.cursor() as cur:
                now = clock.now()
                line = trace.line(now, "PRODUCED", broker="raw")
                batches = [[_row(topic, k * per_thread + j + b, now, now, line) for j in range(per_statement)]
                           for b in range(0, per_thread, per_statement)]
                start_line.wait()
                for rows in batches:
                    _insert(cur, rows)
                    conn.commit()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            start_line.abort()
        finally:
            conn.close()

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    start_line.wait()
    began = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return per_thread * threads / elapsed


def load(url: str, topic: str, total: int, when: Callable[[int], datetime], per_statement: int = 1000,
         progress: Optional[Callable[[int], None]] = None) -> None:
    """Insert ``total`` NEW messages of ``topic``; message i becomes due at ``when(i)``."""
    conn = connect(url)
    now = clock.now()
    line = trace.line(now, "PRODUCED", broker="bench-loader")
    try:
        with conn.cursor() as cur:
            for start in range(0, total, per_statement):
                stop = min(start + per_statement, total)
                _insert(cur, [_row(topic, i, clock.truncate_ms(when(i)), now, line) for i in range(start, stop)])
                conn.commit()
                if progress:
                    progress(stop)
    finally:
        conn.close()


def consume_rate(url: str, topic: str, total: int, lock: int = 500) -> float:
    """Messages/s of one connection looping: lock ``lock`` due rows, read them, mark them SUCCESS."""
    conn = connect(url)
    done = 0
    began = time.perf_counter()
    try:
        with conn.cursor() as cur:
            while done < total:
                now = clock.now()
                token = uuid.uuid4().hex
                # Stored to the millisecond: the read below finds the rows by this exact value.
                expire = clock.truncate_ms(now + timedelta(seconds=60))
                cur.execute(
                    "UPDATE tidemq_message FORCE INDEX (idx_message_lock) SET status = 'RUNNING', "
                    "lease_token = %s, lease_expire = %s, ttr = 60, "
                    "consumer = 'raw', start_time = %s, update_time = %s, attempt = attempt + 1, "
                    "version = version + 1 WHERE topic = %s AND status = 'NEW' "
                    "AND priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0) AND effect_time <= %s "
                    "ORDER BY priority DESC, effect_time, id LIMIT %s",
                    (token, expire, now, now, topic, now, lock))
                # The schema has no index on lease_token (tidemq never reads by it); the lease's
                # expiry time is one range of (topic, status, lease_expire).
                cur.execute("SELECT id, topic, data, effect_time, retry_remaining, attempt, lease_token "
                            "FROM tidemq_message WHERE topic = %s AND status = 'RUNNING' AND lease_expire = %s "
                            "AND lease_token = %s", (topic, expire, token))
                rows = cur.fetchall()
                conn.commit()
                if not rows:
                    raise RuntimeError(f"raw consume found nothing due after {done} of {total}")
                ids = [r[0] for r in rows]
                now = clock.now()
                cur.execute("UPDATE tidemq_message SET status = 'SUCCESS', finish_time = %s, update_time = %s, "
                            "version = version + 1 WHERE id IN (" + ",".join(["%s"] * len(ids)) + ") "
                            "AND status = 'RUNNING'", (now, now, *ids))
                conn.commit()
                done += len(ids)
    finally:
        conn.close()
    return done / (time.perf_counter() - began)


def commit_latency(url: str, topic: str, samples: int, gap: float = 0.0) -> list[float]:
    """ms of one single-row INSERT + COMMIT through PyMySQL, one at a time: the floor under a
    durable produce() on this machine (mostly the log flush). ``gap``: seconds slept after each
    (an idle machine's threads and cores are asleep when the next one comes)."""
    conn = connect(url)
    times = []
    try:
        with conn.cursor() as cur:
            for i in range(samples):
                now = clock.now()
                row = _row(topic, i, now, now, trace.line(now, "PRODUCED", broker="raw"))
                began = time.perf_counter()
                _insert(cur, [row])
                conn.commit()
                times.append((time.perf_counter() - began) * 1000)
                if gap:
                    time.sleep(gap)
    finally:
        conn.close()
    return times


class RowCommitter:
    """One connection committing one single-row INSERT per ``send``: the floor of a durable
    one-message call when every caller has its own connection and nothing is shared."""

    def __init__(self, url: str, topic: str) -> None:
        self.conn = connect(url)
        self.cur = self.conn.cursor()
        self.topic = topic

    def send(self, i: int) -> None:
        now = clock.now()
        _insert(self.cur, [_row(self.topic, i, now, now, trace.line(now, "PRODUCED", broker="raw"))])
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


class GroupCommitter:
    """The raw group-committed floor: callers hand one row each to one writer thread, which inserts
    whatever is queued (up to ``max_rows``) in one multi-row INSERT, commits, and only then wakes
    each caller. The broker's writer without gRPC, validation or a connection pool."""

    def __init__(self, url: str, topic: str, max_rows: int = 5000) -> None:
        self.conn = connect(url)
        self.topic, self.max_rows = topic, max_rows
        self.queue: "queue.SimpleQueue[Optional[list]]" = queue.SimpleQueue()
        self.commits = self.rows = 0
        self.thread = threading.Thread(target=self._run, name="raw-group-commit", daemon=True)
        self.thread.start()

    def send(self, i: int) -> None:
        item = [i, threading.Event(), None]  # payload index, woken after the commit, error
        self.queue.put(item)
        item[1].wait()
        if item[2] is not None:
            raise item[2]

    def _run(self) -> None:
        with self.conn.cursor() as cur:
            while True:
                first = self.queue.get()
                if first is None:
                    return
                batch = [first]
                while len(batch) < self.max_rows:
                    try:
                        item = self.queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        self.queue.put(None)  # stop after this batch
                        break
                    batch.append(item)
                now = clock.now()
                line = trace.line(now, "PRODUCED", broker="raw")
                try:
                    _insert(cur, [_row(self.topic, item[0], now, now, line) for item in batch])
                    self.conn.commit()
                except BaseException as exc:  # raised in every caller of the batch
                    for item in batch:
                        item[2] = exc
                self.commits += 1
                self.rows += len(batch)
                for item in batch:
                    item[1].set()

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(30)
        self.conn.close()


def truncate(url: str) -> None:
    """Empty the message table, its dependency edges and the produce request ids (fast, unlike
    DELETE). The edges go too: ids start again at 1, and an edge left from an earlier message
    would make a new one with its id wait on, or release, another."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE TABLE tidemq_message")
            cur.execute("TRUNCATE TABLE tidemq_dependency")
            cur.execute("TRUNCATE TABLE tidemq_produce_request")
        conn.commit()
    finally:
        conn.close()


class Watch:
    """One connection kept open to watch a drain: a fresh PyMySQL connection costs ~20 ms of CPU
    (it builds a TLS context for its default 'preferred' mode), which polling ten times a second
    took from the processes being measured."""

    def __init__(self, url: str) -> None:
        self.conn = connect(url)
        self.conn.autocommit(True)  # every poll sees the latest commits

    def count(self, topic: str, status: str) -> int:
        with self.conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM tidemq_message WHERE topic = %s AND status = %s", (topic, status))
            return int(cur.fetchone()[0])

    def unfinished(self, topic: str) -> bool:
        """True while any message of ``topic`` is WAITING, NEW or RUNNING: one index probe, so
        polling it costs the database next to nothing (a COUNT over 100k rows would not)."""
        with self.conn.cursor() as cur:
            cur.execute("SELECT 1 FROM tidemq_message WHERE topic = %s AND status IN ('WAITING', 'NEW', 'RUNNING') "
                        "LIMIT 1",
                        (topic,))
            return cur.fetchone() is not None

    def close(self) -> None:
        self.conn.close()


def span(url: str, topic: str) -> tuple[float, int]:
    """(seconds from the first lock to the last SUCCESS, messages done) of ``topic``, from the
    times the brokers recorded: the consume rate without any process start-up in it."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT MIN(start_time), MAX(finish_time), COUNT(*) FROM tidemq_message "
                        "WHERE topic = %s AND status = 'SUCCESS'", (topic,))
            first, last, n = cur.fetchone()
            return ((last - first).total_seconds() if n else 0.0), int(n)
    finally:
        conn.close()


def finish_times(url: str, ids: list[int]) -> dict[int, datetime]:
    """The time the broker stamped on the SUCCESS of each of ``ids`` that succeeded (UTC, ms)."""
    found: dict[int, datetime] = {}
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            for start in range(0, len(ids), 1000):
                part = ids[start:start + 1000]
                cur.execute("SELECT id, finish_time FROM tidemq_message WHERE status = 'SUCCESS' AND id IN ("
                            + ", ".join(["%s"] * len(part)) + ")", part)
                found.update({int(i): t for i, t in cur.fetchall()})
        return found
    finally:
        conn.close()


def make_due(url: str, topic: str) -> datetime:
    """Move every pending message of ``topic`` to due now, in one transaction; returns when."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            now = clock.now()
            cur.execute("UPDATE tidemq_message SET effect_time = %s WHERE topic = %s AND status = 'NEW'", (now, topic))
        conn.commit()
        return now
    finally:
        conn.close()
