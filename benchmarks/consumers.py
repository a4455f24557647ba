"""The benchmark's worker module: ``tidemq worker benchmarks.consumers``.

Declares one no-op QUEUE consumer of ``$BENCH_TOPIC``, with ``$BENCH_THREADS`` handler threads and
pulls of ``$BENCH_BATCH``; with ``$BENCH_DEFAULTS=1`` it is declared with no options at all, as a
new user would write it. With ``$BENCH_LATENESS_FILE`` set, each handler call records how late it
ran (now - effect_time, in ms) through ``benchmarks.lateness_log``.
"""

from __future__ import annotations

import os
import time

from tidemq import Message, mq_consumer

from . import lateness_log

TOPIC = os.environ.get("BENCH_TOPIC", "bench.consume")
THREADS = int(os.environ.get("BENCH_THREADS", "4"))
BATCH = int(os.environ.get("BENCH_BATCH", "500"))
DEFAULTS = os.environ.get("BENCH_DEFAULTS", "") == "1"


def noop(message: Message) -> None:
    """Does nothing, so the figure is the queue's own cost; optionally notes its lateness."""
    if lateness_log.PREFIX and message.effect_time is not None:
        lateness_log.note((time.time() - message.effect_time.timestamp()) * 1000)


if DEFAULTS:
    mq_consumer(TOPIC)(noop)
else:
    mq_consumer(TOPIC, threads=THREADS, batch=BATCH, ttr=120)(noop)
