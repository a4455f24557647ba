"""A delayed message leased ahead starts at its time, ahead of what was prefetched meanwhile.

The handler threads' ``WorkQueue`` and the async ``AsyncHandlers`` both keep a front lane for
the deliveries the ``DueTimer`` hands on when their effect_time comes; messages due when
leased keep their arrival order behind it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta, timezone

from tidemq.due import DueTimer, WorkQueue
from tidemq.link import Delivery
from tidemq.loop import AsyncHandlers, EventLoopThread


def _delivery(id: int, due_in: float = 0.0) -> Delivery:
    return Delivery(id, "t", "null", datetime.now(timezone.utc) + timedelta(seconds=due_in), 0, 1, "a" * 32, 30.0)


def test_on_time_delivery_goes_ahead_of_the_queued_ones():
    work = WorkQueue()
    for i in (1, 2, 3):
        work.put(_delivery(i))
    work.put_on_time(_delivery(9))
    work.put(None)
    assert [d.id if d else None for d in iter(work.get, None)] == [9, 1, 2, 3]


def test_on_time_delivery_wakes_a_waiting_thread():
    work = WorkQueue()
    got: list[int] = []
    taker = threading.Thread(target=lambda: got.append(work.get().id))  # type: ignore[union-attr]
    taker.start()
    work.put_on_time(_delivery(7))
    taker.join(10)
    assert got == [7]
    work.put(_delivery(8))  # the wake-up left behind is skipped, not returned
    assert work.get().id == 8  # type: ignore[union-attr]


def test_timer_hands_due_ones_on_at_once_and_the_rest_on_time():
    ready: list[int] = []
    on_time: list[tuple[int, float]] = []
    handed = threading.Event()

    def hand_on(delivery: Delivery) -> None:
        on_time.append((delivery.id, time.time()))
        handed.set()

    timer = DueTimer(lambda d: ready.append(d.id), hand_on)
    timer.start()
    try:
        later = _delivery(2, due_in=0.2)
        timer.add([_delivery(1), later])
        assert ready == [1] and on_time == []
        assert handed.wait(10)
        assert [id for id, _ in on_time] == [2] and ready == [1]
        assert on_time[0][1] >= later.effect_time.timestamp()  # never early
    finally:
        timer.stop(5)


def test_async_on_time_delivery_starts_before_waiting_ones():
    loop = EventLoopThread("test-lane").start()
    started: list[int] = []
    release = threading.Event()
    done = threading.Event()

    async def run(delivery: Delivery) -> None:
        started.append(delivery.id)
        if delivery.id == 1:
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
        if len(started) == 4:
            done.set()

    handlers = AsyncHandlers(loop, run, concurrency=1)
    try:
        handlers.put(_delivery(1))
        handlers.put(_delivery(2))
        handlers.put(_delivery(3))
        handlers.put(_delivery(9), on_time=True)
        release.set()
        assert done.wait(10)
        assert started == [1, 9, 2, 3] and handlers.peak == 1
    finally:
        loop.stop(5)


def test_async_cancel_gives_back_the_waiting_deliveries():
    loop = EventLoopThread("test-lane-cancel").start()
    running = threading.Event()

    async def run(delivery: Delivery) -> None:
        running.set()
        await asyncio.sleep(60)

    handlers = AsyncHandlers(loop, run, concurrency=1)
    try:
        for i in (1, 2, 3):
            handlers.put(_delivery(i))
        assert running.wait(10)
        assert sorted(d.id for d in handlers.cancel(5)) == [1, 2, 3]
    finally:
        loop.stop(5)
