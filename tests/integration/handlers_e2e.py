"""Handlers for the end-to-end process tests: each run appends "<id> <pid>" to $E2E_LOG."""

import os

from tidemq import Message, MessageType, mq_consumer

LOG = os.environ["E2E_LOG"]


@mq_consumer(os.environ.get("E2E_TOPIC", "e2e.queue"), type=MessageType.QUEUE, threads=4, ttr=30)
def record(message: Message) -> None:
    # O_APPEND writes of one short line are atomic: lines from both workers never interleave.
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{message.id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
