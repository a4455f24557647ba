"""What the fault tests' handlers share: their settings from the environment, and the record each
run appends, "<id> <pid> <attempt> <start> <end>", to $FAULT_LOG (one O_APPEND write per line:
lines of concurrent processes never interleave). No consumer is declared here, so each handler
module declares only its own."""

import os
import time

from tidemq import Message, MessageType

LOG = os.environ["FAULT_LOG"]
SLEEP = float(os.environ.get("FAULT_SLEEP", "0"))
TOPIC = os.environ.get("FAULT_TOPIC", "fault.queue")
TTR = float(os.environ.get("FAULT_TTR", "3"))
KIND = MessageType.parse(os.environ.get("FAULT_TYPE", "QUEUE"))
AHEAD = float(os.environ.get("FAULT_AHEAD", "1.0"))


def record(message: Message, start: float) -> None:
    line = f"{message.id} {os.getpid()} {message.attempt} {start:.6f} {time.time():.6f}\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
