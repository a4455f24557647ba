"""``async def`` handlers for the fault tests: the same records as handlers_faults.py, written
by coroutines that await their simulated work, eight at a time on the worker's event loop. Only
this consumer is declared: a worker of this module runs async handlers alone."""

import asyncio
import time

from tests.faults.fault_records import AHEAD, KIND, SLEEP, TOPIC, TTR, record
from tidemq import Message, mq_consumer


@mq_consumer(TOPIC, type=KIND, ttr=TTR, batch=8, ahead=AHEAD, concurrency=8)
async def handle(message: Message) -> None:
    start = time.time()
    if SLEEP:
        await asyncio.sleep(SLEEP)  # simulated work: the window in which a kill lands mid-handler
    record(message, start)
