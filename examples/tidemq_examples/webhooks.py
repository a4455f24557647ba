"""QUEUE with an ``async def`` handler: webhook calls, many in flight on one event loop.

Consume with ``tidemq worker tidemq_examples.webhooks`` (``--concurrency`` sets how many run at
once for consumers that do not say); produce from asyncio code with
``python -m tidemq_examples.webhooks 100``, which awaits ``tidemq.aio.produce`` a hundred times
at once (the calls share Produce RPCs).
"""

import asyncio
import logging
import sys
from collections import Counter

from tidemq import Message, MessageType, mq_consumer

log = logging.getLogger("tidemq.examples.webhooks")
#: Calls made per URL in this process (what the examples test checks).
delivered: Counter = Counter()


@mq_consumer("example.webhook", type=MessageType.QUEUE, concurrency=32, ttr=30)
async def call_webhook(message: Message) -> None:
    """POST the event to its URL; raising (a timeout, a 5xx) would retry it later."""
    url = message.data["url"]
    await asyncio.sleep(0.01)  # where an HTTP client's `await session.post(url, json=...)` goes
    delivered[url] += 1
    log.info("webhook %s called for event %s (message %d)", url, message.data.get("event"), message.id)


async def main(count: int) -> list[int]:
    """Produce ``count`` webhook messages concurrently and return their ids."""
    import tidemq.aio

    try:
        return await asyncio.gather(*(tidemq.aio.produce("example.webhook", {"url": f"https://example.com/hook/{n % 4}",
                                                                             "event": n})
                                      for n in range(count)))
    finally:
        await tidemq.aio.close()


if __name__ == "__main__":
    ids = asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
    print(f"produced {len(ids)} webhook messages, ids {ids[0]}..{ids[-1]}")
