"""An ``async def`` consumer for tests/integration/test_async_handlers.py; its concurrency comes
from ``tidemq worker --concurrency``. Each run appends "<id> <pid> <attempt> <start> <end>" to
$ASYNC_LOG with one O_APPEND write (and "<id>" to $ASYNC_LOG.started when it begins); data
{"fail": n} makes the first n attempts raise."""

import asyncio
import os
import time

from tidemq import Message, MessageType, mq_consumer

TOPIC = "async.jobs"
TTR = 1.0
RUN_SECONDS = float(os.environ.get("ASYNC_RUN_SECONDS", "0"))


@mq_consumer(TOPIC, type=MessageType.QUEUE, ttr=TTR, batch=4)
async def job(message: Message) -> None:
    start = time.time()
    _append(os.environ["ASYNC_LOG"] + ".started", f"{message.id}\n")
    await asyncio.sleep(RUN_SECONDS)  # longer than the ttr: only the heartbeats keep the lease
    _append(os.environ["ASYNC_LOG"], f"{message.id} {os.getpid()} {message.attempt} {start:.6f} {time.time():.6f}\n")
    if message.attempt <= message.data.get("fail", 0):
        raise RuntimeError(f"attempt {message.attempt} fails on purpose")


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
