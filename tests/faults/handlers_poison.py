"""A consumer whose handler kills its own worker (``os._exit``) on every message whose data says
``{"poison": true}``, as a segfaulting library or an out-of-memory kill would. Each run first
logs its start to $HANDLER_LOG, so the test can count deliveries."""

import os
import time

from tests.integration.handlers_common import record
from tidemq import Message, MessageType, mq_consumer

TOPIC = os.environ.get("FAULT_TOPIC", "fault.poison")


@mq_consumer(TOPIC, type=MessageType.QUEUE, threads=1, ttr=1, batch=1)
def handle(message: Message) -> None:
    record(message.id, time.time())
    if isinstance(message.data, dict) and message.data.get("poison"):
        os._exit(17)  # no ack, no drain: the lease is all that is left
