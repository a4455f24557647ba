"""``tidemq topic limits TOPIC``: show or set a topic's flow limits."""

from __future__ import annotations

import argparse

from tidemq import Settings, clock

__all__ = ["register", "run_topic"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tidemq topic limits``."""
    topic = sub.add_parser("topic", help="topic settings")
    actions = topic.add_subparsers(dest="topic_command", required=True)
    limits = actions.add_parser("limits", help="show or set a topic's flow limits (no option: show them)")
    limits.add_argument("topic")
    limits.add_argument("--max-running", metavar="N", help="RUNNING messages at once, cluster-wide ('none': no limit)")
    limits.add_argument("--rate", metavar="R", help="messages started per second ('none': no limit)")
    limits.add_argument("--per-key", metavar="N", help="RUNNING messages per producer key ('none': no limit)")
    limits.set_defaults(func=run_topic)


def run_topic(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq.validation import check_topic
    from tidemq_broker.flow import check_limits, parse_limit
    from tidemq_broker.storages import open_storage

    name = check_topic(args.topic)
    storage = open_storage(settings.db_url)
    try:
        current = next((s for s in storage.topics.list_topics() if s.name == name), None)
        old = (current.max_running, current.rate_per_second, current.max_running_per_key) if current else (None,) * 3
        given = (args.max_running, args.rate, args.per_key)
        if any(value is not None for value in given):
            new = [old[i] if value is None else parse_limit(value, float if i == 1 else int)
                   for i, value in enumerate(given)]
            limits = check_limits(*new)
            storage.topics.set_topic_limits(name, limits, clock.now())
            old = (limits.max_running, limits.rate_per_second, limits.max_running_per_key)
    finally:
        storage.close()
    shown = ["none" if value is None else f"{value:g}" for value in old]
    print(f"{name}: max_running={shown[0]} rate={shown[1]}/s per_key={shown[2]}")
    return 0
