"""Handlers for the fault tests. Each run appends "<id> <pid> <attempt> <start> <end>" to
$FAULT_LOG (one O_APPEND write per line: lines of concurrent processes never interleave)."""

import os
import time

from tidemq import Message, MessageType, mq_consumer

LOG = os.environ["FAULT_LOG"]
SLEEP = float(os.environ.get("FAULT_SLEEP", "0"))
TOPIC = os.environ.get("FAULT_TOPIC", "fault.queue")
TTR = float(os.environ.get("FAULT_TTR", "3"))
KIND = MessageType.parse(os.environ.get("FAULT_TYPE", "QUEUE"))
AHEAD = float(os.environ.get("FAULT_AHEAD", "1.0"))


def _record(message: Message, start: float) -> None:
    line = f"{message.id} {os.getpid()} {message.attempt} {start:.6f} {time.time():.6f}\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@mq_consumer(TOPIC, type=KIND, threads=4, ttr=TTR, batch=8, ahead=AHEAD)
def handle(message: Message) -> None:
    start = time.time()
    if SLEEP:
        time.sleep(SLEEP)  # simulated work: the window in which a kill lands mid-handler
    _record(message, start)
