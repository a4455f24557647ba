"""Consumers for the results tests: what a handler returns, raises, reports and does once its
message's cancel is requested. Each start is recorded as "<id> <pid>" in $RESULTS_LOG (one
O_APPEND write per line)."""

import asyncio
import os
import time

from tidemq import Message, mq_consumer

LOG = os.environ["RESULTS_LOG"]
TTR = float(os.environ.get("RESULTS_TTR", "3"))
QUIET_TTR = 300.0  # its heartbeats come every 100 s


def started(message: Message) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{message.id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@mq_consumer("results.sync", threads=4, ttr=TTR, batch=1)
def handle(message: Message):
    started(message)
    kind = message.data["kind"]
    if kind == "value":
        return {"echo": message.data["v"], "pid": os.getpid()}
    if kind == "sized":  # a JSON string of exactly `bytes` bytes
        return "x" * (message.data["bytes"] - 2)
    if kind == "not_json":
        return {1, 2}
    if kind == "raise":
        raise LookupError(f"nothing for {message.data['v']}")
    if kind == "until_cancelled":
        step = 0
        while True:
            step += 1
            message.progress(step, None, note=f"step {step}")
            message.checkpoint()
            time.sleep(0.05)
    if kind == "quick":
        time.sleep(message.data.get("sleep", 0.0))
        message.checkpoint()
        return "finished"
    if kind == "gate":  # finishes once the test creates the file
        while not os.path.exists(message.data["path"]):
            time.sleep(0.02)
        return {"gate": "open"}
    if kind == "hang":  # ignores its cancel: only a kill stops it
        time.sleep(3600)
    raise ValueError(f"unknown kind {kind}")


@mq_consumer("results.quiet", threads=2, ttr=QUIET_TTR, batch=1)
def handle_quiet(message: Message):
    """Reports no progress, so no call of its own tells it of its cancel: only its heartbeat,
    every ttr/3, or the cancel signal of its topic."""
    started(message)
    while not message.cancelled:
        time.sleep(0.01)
    message.checkpoint()  # raises: the message ends CANCELLED


@mq_consumer("results.async", ttr=TTR, batch=1)
async def handle_async(message: Message):
    started(message)
    while True:
        message.progress(1, 2, note="waiting")
        await asyncio.sleep(0.05)
