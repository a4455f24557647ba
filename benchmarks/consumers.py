"""The benchmark's worker module: ``tidemq worker benchmarks.consumers``.

Declares one QUEUE consumer of ``$BENCH_TOPIC`` (``$BENCH_THREADS`` handler threads, pulls of
``$BENCH_BATCH``, 0 meaning tidemq's default, lease ``$BENCH_TTR`` seconds); the handler sleeps
``$BENCH_SLEEP_MS`` (0: a no-op, so the figure is the queue's own cost). With
``$BENCH_DEFAULTS=1`` it is declared with no options at all, as a new user would write it.

With ``$BENCH_RESULT=1`` the handler returns a small dict, which the worker stores as the
message's result (the ``results`` scenario compares it with handlers that return nothing).
With ``$BENCH_UNTIL_CANCELLED=1`` it runs until its message's cancel is requested, reporting no
progress (so only a heartbeat can tell it), and then stops by ``message.checkpoint()``.

With ``$BENCH_LATENESS_FILE`` set, each handler call records how late it ran (now - effect_time,
in ms) through ``benchmarks.lateness_log``, so the benchmark reads lateness as the handler saw it.

With ``$BENCH_RECORD_FILE`` set, each handler call first appends one line
``<id> <attempt> <start> <effect_time> <sent> <kind>`` (epoch seconds; ``sent`` and ``kind`` are
the message data's ``t`` and ``k``, "-" when absent) to ``<file>.<pid>`` with one unbuffered
write: a worker killed with ``kill -9`` has still left a line for every handler it started,
which is how the pressure scenario counts runs per message and names the process of each.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from tidemq import Message, mq_consumer

from . import lateness_log

TOPIC = os.environ.get("BENCH_TOPIC", "bench.consume")
THREADS = int(os.environ.get("BENCH_THREADS", "4"))
BATCH = int(os.environ.get("BENCH_BATCH", "500")) or None
TTR = float(os.environ.get("BENCH_TTR", "120"))
SLEEP = float(os.environ.get("BENCH_SLEEP_MS", "0")) / 1000
DEFAULTS = os.environ.get("BENCH_DEFAULTS", "") == "1"
RECORD_FILE = os.environ.get("BENCH_RECORD_FILE", "")
RESULT = os.environ.get("BENCH_RESULT", "") == "1"
UNTIL_CANCELLED = os.environ.get("BENCH_UNTIL_CANCELLED", "") == "1"

# Opened once: an O_APPEND write per line is one system call, cheap beside a 1 ms handler.
_record_fd = os.open(f"{RECORD_FILE}.{os.getpid()}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) \
    if RECORD_FILE else -1


def _record(message: Message, start: float) -> None:
    data = message.data if isinstance(message.data, dict) else {}
    effect = message.effect_time.timestamp() if message.effect_time is not None else 0.0
    line = f"{message.id} {message.attempt} {start:.6f} {effect:.3f} {data.get('t', '-')} {data.get('k', '-')}\n"
    os.write(_record_fd, line.encode())


def handle(message: Message) -> Optional[dict]:
    """Notes its start (record) or its lateness when asked to, then sleeps ``$BENCH_SLEEP_MS``;
    returns a small dict with ``$BENCH_RESULT=1``."""
    start = time.time()
    if _record_fd >= 0:
        _record(message, start)
    if lateness_log.PREFIX and message.effect_time is not None:
        lateness_log.note((start - message.effect_time.timestamp()) * 1000)
    if SLEEP:
        time.sleep(SLEEP)
    if UNTIL_CANCELLED:
        while not message.cancelled:
            time.sleep(0.0005)
        message.checkpoint()  # raises: the message ends CANCELLED
    return {"ok": True, "id": message.id} if RESULT else None


if DEFAULTS:
    mq_consumer(TOPIC)(handle)
else:
    mq_consumer(TOPIC, threads=THREADS, batch=BATCH, ttr=TTR)(handle)
