"""Worker module: a SERIAL_QUEUE consumer that logs when each run begins and ends."""

import os
import time

from tests.integration.handlers_common import record
from tidemq import Message, MessageType, mq_consumer

TOPIC = os.environ.get("HANDLER_TOPIC", "it.serial")
SLEEP = float(os.environ.get("HANDLER_SLEEP", "0.05"))


@mq_consumer(TOPIC, type=MessageType.SERIAL_QUEUE, ttr=float(os.environ.get("HANDLER_TTR", "2")))
def handle(message: Message) -> None:
    start = time.time()
    record(message.id, start)
    time.sleep(float(message.data.get("sleep", SLEEP)) if isinstance(message.data, dict) else SLEEP)
    if isinstance(message.data, dict) and message.data.get("fail_first") and message.attempt == 1:
        record(message.id, start, time.time(), "failed")
        raise RuntimeError("the first attempt of this message fails on purpose")
    record(message.id, start, time.time())
