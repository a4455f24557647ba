"""A consumer whose handler runs three times its ttr (tests/integration/test_heartbeats.py).

Each run appends "<id> <pid> <attempt> <start> <end>" to $HB_LOG with one O_APPEND write, so
lines of the two worker processes never interleave.
"""

import os
import time

from tidemq import Message, MessageType, mq_consumer

TOPIC = "hb.long"
TTR = 2.0
RUN_SECONDS = float(os.environ.get("HB_RUN_SECONDS", "6"))


@mq_consumer(TOPIC, type=MessageType.QUEUE, threads=2, ttr=TTR, batch=1)
def long_job(message: Message) -> None:
    start = time.time()
    time.sleep(RUN_SECONDS)  # the long job: nothing here extends the lease, only the worker's heartbeats
    line = f"{message.id} {os.getpid()} {message.attempt} {start:.6f} {time.time():.6f}\n"
    fd = os.open(os.environ["HB_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
