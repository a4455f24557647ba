"""``tidemq schedule``: add, list, remove, pause and resume periodic messages (in the database)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Optional

from tidemq import clock
from tidemq.config import Settings

__all__ = ["register", "run"]


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``schedule`` sub-command to ``sub``."""
    schedule = sub.add_parser("schedule", help="periodic messages: one message per tick of a cron expression")
    actions = schedule.add_subparsers(dest="schedule_action", required=True)
    add = actions.add_parser("add", help="add a schedule, or change the one of that name")
    add.add_argument("name", help="1-200 of A-Z a-z 0-9 . _ : -")
    add.add_argument("topic")
    add.add_argument("cron", help="5 fields ('*/5 * * * *'), 6 with seconds first ('*/10 * * * * *'), or @daily")
    add.add_argument("--data", default="null", help="JSON text of each message's data (default: null)")
    add.add_argument("--timezone", default="UTC", help="IANA time zone the expression is read in (default: UTC)")
    add.add_argument("--missed", choices=["once", "skip"], default="once",
                     help="ticks missed in an outage: once (produce the latest) or skip (default: once)")
    add.add_argument("--retry", type=int, help="retries of each message (default: the topic's)")
    actions.add_parser("list", help="list schedules with their next tick")
    for action, text in (("remove", "remove a schedule (messages already produced stay)"),
                         ("pause", "stop producing until resumed"),
                         ("resume", "produce again from now on (paused ticks are not caught up)")):
        actions.add_parser(action, help=text).add_argument("name")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq_broker.schedules import check_schedule, next_tick
    from tidemq_broker.storages import open_storage

    storage = open_storage(settings.db_url)
    try:
        now = clock.now()
        if args.schedule_action == "add":
            schedule = check_schedule(args.name, args.topic, args.cron, args.data, args.timezone, args.missed,
                                      args.retry, data_is_json=True)
            created = storage.schedules.put_schedule(schedule, now)
            following = next_tick(schedule, now)
            print(f"schedule {schedule.name} {'added' if created else 'updated'}; next tick "
                  f"{_time(following)} UTC")
        elif args.schedule_action == "list":
            print(f"{'name':<24} {'topic':<24} {'cron':<18} {'timezone':<18} {'missed':<6} {'state':<7} "
                  "next tick (UTC)")
            for s in storage.schedules.list_schedules():
                following = None if s.paused else next_tick(s, now)
                print(f"{s.name:<24} {s.topic:<24} {s.cron:<18} {s.timezone:<18} {s.missed:<6} "
                      f"{'paused' if s.paused else 'active':<7} {_time(following)}")
        else:
            done = (storage.schedules.delete_schedule(args.name) if args.schedule_action == "remove"
                    else storage.schedules.pause_schedule(args.name, args.schedule_action == "pause", now))
            if not done:
                print(f"tidemq: no schedule named {args.name!r}")
                return 1
            print(f"schedule {args.name} {args.schedule_action.rstrip('e')}ed")
    finally:
        storage.close()
    return 0


def _time(moment: Optional[datetime]) -> str:
    return moment.isoformat(sep=" ", timespec="seconds") if moment else "-"
