"""AsyncCoalescer: concurrent coroutines share flushes, within the slot, item and byte limits;
each gets its own result or error; a request still queued at its deadline is withdrawn unsent."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.aio.coalesce import AsyncCoalescer
from tidemq.errors import BrokerUnavailableError

pytestmark = pytest.mark.asyncio


def not_sent(timeout: float) -> BaseException:
    return BrokerUnavailableError(f"not sent within {timeout:.1f} s")


async def test_requests_queued_behind_busy_slots_go_together_in_the_next_flush():
    gate = asyncio.Event()
    flushed: list[list[int]] = []

    async def flush(batch):
        flushed.append([r.payload for r in batch])
        await gate.wait()
        for r in batch:
            r.result = r.payload * 10

    coalescer = AsyncCoalescer(flush, slots=1, max_items=3, max_bytes=1000, timeout_error=not_sent)
    calls = [asyncio.create_task(coalescer.submit(n)) for n in range(7)]
    while not flushed:  # every call queues; the first takes the only slot alone
        await asyncio.sleep(0)
    assert flushed == [[0]]
    gate.set()
    assert await asyncio.gather(*calls) == [n * 10 for n in range(7)]
    assert flushed == [[0], [1, 2, 3], [4, 5, 6]]  # at most three items per flush
    assert (coalescer.flushes, coalescer.requests) == (3, 7)


async def test_a_request_still_queued_at_its_deadline_is_withdrawn_and_never_sent():
    gate = asyncio.Event()
    sent: list[str] = []

    async def flush(batch):
        sent.extend(r.payload for r in batch)
        await gate.wait()
        for r in batch:
            r.result = "ok"

    coalescer = AsyncCoalescer(flush, slots=1, max_items=10, max_bytes=1000, timeout_error=not_sent)
    first = asyncio.create_task(coalescer.submit("first"))
    await asyncio.sleep(0)
    with pytest.raises(BrokerUnavailableError, match="not sent within 0.1 s"):
        await coalescer.submit("late", timeout=0.1)
    gate.set()
    assert await first == "ok"
    assert sent == ["first"]


async def test_a_bug_in_flush_reaches_every_caller_of_that_flush_and_the_next_flush_still_runs():
    calls = 0

    async def flush(batch):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("bug")
        for r in batch:
            r.result = r.payload

    coalescer = AsyncCoalescer(flush, slots=1, max_items=10, max_bytes=1000, timeout_error=not_sent)
    with pytest.raises(KeyError):
        await coalescer.submit(1)
    assert await coalescer.submit(2) == 2


async def test_a_cancelled_caller_s_queued_request_is_not_sent():
    gate = asyncio.Event()
    sent: list[int] = []

    async def flush(batch):
        sent.extend(r.payload for r in batch)
        await gate.wait()
        for r in batch:
            r.result = r.payload

    coalescer = AsyncCoalescer(flush, slots=1, max_items=10, max_bytes=1000, timeout_error=not_sent)
    first = asyncio.create_task(coalescer.submit(1))
    queued = asyncio.create_task(coalescer.submit(2))
    await asyncio.sleep(0)
    queued.cancel()  # before its task even sees the cancellation, the flush below ends
    gate.set()
    assert await first == 1
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert sent == [1]
