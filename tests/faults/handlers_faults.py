"""Threaded handlers for the fault tests; each run is recorded by fault_records.record."""

import time

from tests.faults.fault_records import AHEAD, KIND, SLEEP, TOPIC, TTR, record
from tidemq import Message, mq_consumer


@mq_consumer(TOPIC, type=KIND, threads=4, ttr=TTR, batch=8, ahead=AHEAD)
def handle(message: Message) -> None:
    start = time.time()
    if SLEEP:
        time.sleep(SLEEP)  # simulated work: the window in which a kill lands mid-handler
    record(message, start)
