"""Worker module: a TOPIC consumer that logs every broadcast it runs (data in the extra field)."""

import json
import os
import time

from tests.integration.handlers_common import record
from tidemq import Message, MessageType, mq_consumer

TOPIC = os.environ.get("HANDLER_TOPIC", "it.topic")


@mq_consumer(TOPIC, type=MessageType.TOPIC)
def handle(message: Message) -> None:
    start = time.time()
    record(message.id, start, time.time(), json.dumps(message.data, separators=(",", ":")))
