"""The workflow scale tests' consumer: steps that sleep $FAULT_SLEEP seconds (the window a kill
lands in) and record each completed run as tests.faults.fault_records does ("<id> <pid>
<attempt> <start> <end>" in $FAULT_LOG), in pulls of $WORKFLOW_BATCH."""

import os
import time

from tests.faults.fault_records import SLEEP, TOPIC, TTR, record
from tidemq import Message, mq_consumer


@mq_consumer(TOPIC, threads=4, ttr=TTR, batch=int(os.environ.get("WORKFLOW_BATCH", "100")))
def handle(message: Message) -> None:
    start = time.time()
    if SLEEP:
        time.sleep(SLEEP)
    record(message, start)
