"""Which ticks of a schedule are due: time zones, daylight saving, missed ticks once or skipped."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from tidemq.errors import InvalidScheduleError, InvalidTopicError
from tidemq_broker.schedules import check_schedule, due_ticks, next_tick, unique_key


def sched(cron, zone="UTC", missed="once", ticks_from=datetime(2025, 1, 1), last_tick=None):
    return dataclasses.replace(check_schedule("s1", "t.sched", cron, None, zone, missed), ticks_from=ticks_from,
                               last_tick=last_tick)


def test_every_on_time_tick_is_produced_with_seconds_first():
    s = sched("*/2 * * * * *", ticks_from=datetime(2025, 1, 1, 0, 0, 0, 300_000))
    due = due_ticks(s, datetime(2025, 1, 1, 0, 0, 7))
    assert due.produce == [datetime(2025, 1, 1, 0, 0, 2), datetime(2025, 1, 1, 0, 0, 4), datetime(2025, 1, 1, 0, 0, 6)]
    assert due.last == datetime(2025, 1, 1, 0, 0, 6)
    # The next round starts after the last tick handled: nothing twice, nothing left out.
    again = dataclasses.replace(s, last_tick=due.last)
    assert due_ticks(again, datetime(2025, 1, 1, 0, 0, 7, 900_000)).produce == []
    assert due_ticks(again, datetime(2025, 1, 1, 0, 0, 8)).produce == [datetime(2025, 1, 1, 0, 0, 8)]


def test_missed_ticks_once_produces_the_latest_and_skip_none():
    start, now = datetime(2025, 1, 1), datetime(2025, 1, 1, 5, 0, 3)  # 5 hours without a leader
    once = due_ticks(sched("0 * * * *", ticks_from=start), now)
    assert once.produce == [datetime(2025, 1, 1, 5)]  # 1:00 to 5:00 are due; 5:00, on time, runs once for all
    late = due_ticks(sched("0 * * * *", ticks_from=start), datetime(2025, 1, 1, 5, 0, 30))
    assert late.produce == [datetime(2025, 1, 1, 5)] and late.last == datetime(2025, 1, 1, 5)
    skip = due_ticks(sched("0 * * * *", missed="skip", ticks_from=start), datetime(2025, 1, 1, 5, 0, 30))
    assert skip.produce == [] and skip.last == datetime(2025, 1, 1, 5)  # moved on to the next future tick
    # Per second: the ticks younger than 10 s are on time, each produced; the older ones are not.
    fast = due_ticks(sched("* * * * * *", ticks_from=start), datetime(2025, 1, 1, 0, 1))
    assert fast.produce == [datetime(2025, 1, 1, 0, 0, s) for s in range(51, 60)] + [datetime(2025, 1, 1, 0, 1)]
    assert fast.last == datetime(2025, 1, 1, 0, 1)


def test_nothing_due_before_the_first_tick():
    due = due_ticks(sched("0 12 * * *", ticks_from=datetime(2025, 1, 1, 11)), datetime(2025, 1, 1, 11, 59, 59))
    assert due.produce == [] and due.last is None


def test_a_time_zone_moves_the_ticks_to_its_offset():
    s = sched("0 9 * * *", "Asia/Tokyo", ticks_from=datetime(2025, 6, 1))
    assert next_tick(s, datetime(2025, 5, 31, 23)) == datetime(2025, 6, 1, 0)  # 09:00 JST is 00:00 UTC
    ny = sched("30 8 * * 1-5", "America/New_York", ticks_from=datetime(2025, 1, 3))
    assert next_tick(ny, datetime(2025, 1, 3, 14)) == datetime(2025, 1, 6, 13, 30)  # Monday, EST = UTC-5
    assert next_tick(ny, datetime(2025, 7, 3, 14)) == datetime(2025, 7, 4, 12, 30)  # summer, EDT = UTC-4


def test_daylight_saving_fixed_hours_fire_once_and_hourly_keeps_every_hour():
    berlin_back = datetime(2025, 10, 25, 12)  # clocks go back on 2025-10-26 at 03:00 CEST
    daily = due_ticks(sched("30 2 * * *", "Europe/Berlin", ticks_from=berlin_back), datetime(2025, 10, 26, 3),
                      missed_after=10**9)
    assert daily.produce == [datetime(2025, 10, 26, 0, 30)]  # 02:30 CEST, not again at 02:30 CET
    hourly = due_ticks(sched("0 * * * *", "Europe/Berlin", ticks_from=datetime(2025, 10, 25, 22, 30)),
                       datetime(2025, 10, 26, 2, 30), missed_after=10**9)
    assert hourly.produce == [datetime(2025, 10, 25, 23), datetime(2025, 10, 26, 0), datetime(2025, 10, 26, 1),
                              datetime(2025, 10, 26, 2)]  # 01:00, 02:00 CEST, 02:00 CET, 03:00 CET
    forward = sched("30 2 * * *", "Europe/Berlin", ticks_from=datetime(2025, 3, 29, 12))
    # 02:30 does not exist on 2025-03-30: it fires once, at the end of the gap (03:00 CEST).
    assert next_tick(forward, datetime(2025, 3, 29, 12)) == datetime(2025, 3, 30, 1)
    assert next_tick(forward, datetime(2025, 3, 30, 1)) == datetime(2025, 3, 31, 0, 30)


def test_unique_key_names_the_schedule_and_the_utc_tick():
    assert unique_key("nightly", datetime(2025, 1, 2, 3, 4, 5)) == "schedule:nightly:2025-01-02T03:04:05Z"


@pytest.mark.parametrize("kwargs, match", [
    ({"cron": "* * * *"}, "5 fields"),
    ({"cron": "61 * * * *"}, "not valid"),
    ({"cron": "* * * * * * *"}, "6 with seconds first"),
    ({"cron": ""}, "5 fields"),
    ({"timezone_name": "Mars/Olympus"}, "IANA"),
    ({"missed": "all"}, "'once'"),
    ({"name": "a b"}, "schedule name"),
    ({"name": "x" * 201}, "1-200"),
    ({"retry": -2}, "retry"),
])
def test_bad_schedules_are_refused_naming_the_expected_form(kwargs, match):
    args = {"name": "s1", "topic": "t.ok", "cron": "* * * * *", **kwargs}
    with pytest.raises(InvalidScheduleError, match=match):
        check_schedule(**args)


def test_bad_topic_is_the_topic_error():
    with pytest.raises(InvalidTopicError):
        check_schedule("s1", "bad topic", "* * * * *")
