"""Periodic messages: checking a schedule, and which of its ticks are due.

A schedule names a topic, a cron expression (5 fields, or 6 with seconds first, as in Quartz and
Spring; the ``@daily`` style aliases too) read in an IANA time zone, and what to do with ticks
missed in an outage. croniter computes the ticks; this module decides which to produce.

A tick is *on time* while it is younger than ``missed_after`` seconds: every on-time tick is
produced. Older ticks were missed (no leader, a database outage). Policy ``once`` produces one
message for them: the on-time ticks of the same round when there are any, else the latest missed
tick. Policy ``skip`` produces none of them and moves on to the next tick. In the repeated hour
when clocks go back, a schedule whose hour field is not ``*`` fires once (the first pass), as
cron does; hourly and finer schedules keep ticking through both passes. A local time skipped
when clocks go forward fires at the first moment after the gap (croniter's reading).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from tidemq.errors import InvalidScheduleError, quote
from tidemq.validation import MAX_RETRIES, check_data_text, check_topic, encode_data

from .storage import Schedule

__all__ = ["MISSED_POLICIES", "MISSED_AFTER", "Due", "check_schedule", "due_ticks", "next_tick", "unique_key",
           "NAME_MAX_LENGTH"]

MISSED_POLICIES = ("once", "skip")
#: Seconds after which a tick not yet produced counts as missed. Above the leader's round (under a
#: second) and a short database stall, below the gap a lost leader leaves (the ZooKeeper session
#: timeout and an election).
MISSED_AFTER = 10.0
NAME_MAX_LENGTH = 200  # the unique key "schedule:<name>:<tick>" must fit in 255 characters
_NAME = re.compile(r"[A-Za-z0-9._:-]+")
_CRON_FORM = ("5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, "
              "or an alias such as @hourly or @daily")
_TICK_LIMIT = 10_000  # on-time ticks in one round at most: a per-second schedule has 10


@dataclass(frozen=True)
class Due:
    """One round's outcome for a schedule: the ticks to produce (naive UTC, oldest first) and the
    latest tick handled, produced or skipped (None when nothing fell due)."""

    produce: list[datetime]
    last: Optional[datetime]


def check_schedule(name: Any, topic: Any, cron: Any, data: Any = None, timezone_name: Any = "UTC",
                   missed: Any = "once", retry: Optional[int] = None, *, data_is_json: bool = False) -> Schedule:
    """A validated :class:`Schedule`; raises ``InvalidScheduleError`` naming the expected form.

    ``data`` is any JSON value, or JSON text with ``data_is_json``."""
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH or not _NAME.fullmatch(name):
        raise InvalidScheduleError(f"a schedule name is 1-{NAME_MAX_LENGTH} of A-Z a-z 0-9 . _ : -, got {quote(name)}")
    topic = check_topic(topic)
    cron = check_cron(cron)
    zone = check_timezone(timezone_name)
    if missed not in MISSED_POLICIES:
        raise InvalidScheduleError("missed must be 'once' (produce the latest missed tick) or 'skip', "
                                   f"got {quote(missed)}")
    if retry is not None and not (isinstance(retry, int) and 0 <= retry <= MAX_RETRIES):
        raise InvalidScheduleError(f"retry must be between 0 and {MAX_RETRIES} (or None: the topic's), "
                                   f"got {quote(retry)}")
    text = check_data_text(data) if data_is_json else encode_data(data)
    return Schedule(name=name, topic=topic, cron=cron, timezone=zone, data=text, retry=retry, missed=missed)


def check_cron(cron: Any) -> str:
    """``cron`` normalised to single spaces if croniter reads it; else InvalidScheduleError."""
    text = " ".join(cron.split()) if isinstance(cron, str) else ""
    fields = len(text.split())
    if not text or not (fields in (5, 6) or (fields == 1 and text.startswith("@"))) or len(text) > 255:
        raise InvalidScheduleError(f"cron must be {_CRON_FORM}; got {quote(cron)}")
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=timezone.utc), second_at_beginning=True).get_next(datetime)
    except (CroniterError, ValueError, KeyError) as exc:
        reason = str(exc).replace(f"[{text}] ", "")  # croniter repeats the expression, quoted already
        raise InvalidScheduleError(f"cron {quote(text)} is not valid ({reason}); expected {_CRON_FORM}") from None
    return text


def check_timezone(name: Any) -> str:
    """An IANA time zone name (``UTC``, ``Europe/Berlin``); else InvalidScheduleError."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidScheduleError(f"timezone must be an IANA name such as 'UTC' or 'Europe/Berlin', got {quote(name)}")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidScheduleError(
            f"timezone {quote(name)} is not an IANA time zone name (such as 'UTC' or 'Europe/Berlin')") from None
    return name


def unique_key(name: str, tick: datetime) -> str:
    """The message key of one tick: the same on every broker, so a tick is stored once."""
    return f"schedule:{name}:{tick.isoformat(timespec='seconds')}Z"


def _ticks(schedule: Schedule, after: datetime) -> Iterator[datetime]:
    """Ticks strictly after ``after`` (naive UTC), as naive UTC, without the repeated hour's
    second pass for schedules at fixed hours."""
    zone = ZoneInfo(schedule.timezone)
    start = after.replace(tzinfo=timezone.utc).astimezone(zone)
    it = croniter(schedule.cron, start, second_at_beginning=True)
    fixed_hours = it.expanded[1] != ["*"]
    while True:
        local = it.get_next(datetime)
        if fixed_hours and local.fold == 1 and _ambiguous(local):
            continue
        yield local.astimezone(timezone.utc).replace(tzinfo=None)


def _ambiguous(local: datetime) -> bool:
    return local.replace(fold=0).utcoffset() != local.replace(fold=1).utcoffset()


def _latest_at_or_before(schedule: Schedule, moment: datetime, after: datetime) -> Optional[datetime]:
    """The latest tick in (``after``, ``moment``], or None."""
    zone = ZoneInfo(schedule.timezone)
    it = croniter(schedule.cron, (moment + timedelta(seconds=1)).replace(tzinfo=timezone.utc).astimezone(zone),
                  second_at_beginning=True)
    for _ in range(3):  # at most: a tick inside the added second, a repeated hour's second pass
        local = it.get_prev(datetime)
        tick = local.astimezone(timezone.utc).replace(tzinfo=None)
        if tick <= after:
            return None
        if tick <= moment and not (it.expanded[1] != ["*"] and local.fold == 1 and _ambiguous(local)):
            return tick
    return None


def due_ticks(schedule: Schedule, now: datetime, missed_after: float = MISSED_AFTER) -> Due:
    """Which ticks of ``schedule`` to produce at ``now`` (naive UTC); see the module's rules."""
    if schedule.ticks_from is None:
        raise ValueError("a stored schedule has ticks_from")
    base = max(schedule.last_tick or schedule.ticks_from, schedule.ticks_from)
    cutoff = now - timedelta(seconds=missed_after)
    produce: list[datetime] = []
    latest_missed = None
    if base < cutoff:
        latest_missed = _latest_at_or_before(schedule, cutoff, base)
        base = cutoff
    for tick in _ticks(schedule, base):
        if tick > now or len(produce) >= _TICK_LIMIT:
            break
        produce.append(tick)
    if latest_missed is not None and not produce and schedule.missed == "once":
        produce.append(latest_missed)
    return Due(produce, produce[-1] if produce else latest_missed)


def next_tick(schedule: Schedule, now: datetime) -> Optional[datetime]:
    """The first tick after ``now`` (naive UTC): what the console and ``tidemq schedule list`` show."""
    try:
        return next(_ticks(schedule, now))
    except (CroniterError, StopIteration, ValueError):
        return None
