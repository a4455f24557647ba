"""A handler for the --max-idle test: it sleeps ``data["sleep"]`` seconds and appends
"<id> <start> <end>" (Unix times) to $IDLE_LOG."""

import os
import time

from tidemq import Message, mq_consumer


@mq_consumer("idle.queue", threads=2, ttr=30)
def work(message: Message) -> None:
    start = time.time()
    time.sleep(message.data.get("sleep", 0))
    with open(os.environ["IDLE_LOG"], "a") as fh:
        fh.write(f"{message.id} {start} {time.time()}\n")
