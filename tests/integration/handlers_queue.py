"""Worker module: a QUEUE consumer that logs every run (``tidemq worker tests.integration.handlers_queue``)."""

import os
import time

from tests.integration.handlers_common import record
from tidemq import Message, MessageType, mq_consumer

TOPIC = os.environ.get("HANDLER_TOPIC", "it.queue")
SLEEP = float(os.environ.get("HANDLER_SLEEP", "0.01"))


@mq_consumer(TOPIC, type=MessageType.QUEUE, threads=int(os.environ.get("HANDLER_THREADS", "4")),
             ttr=float(os.environ.get("HANDLER_TTR", "2")), batch=4)
def handle(message: Message) -> None:
    start = time.time()
    time.sleep(SLEEP)
    record(message.id, start, time.time())
