"""``tidemq cancel ID... [--running] [--workflow]``: cancel messages, or whole workflows, from the
shell, as ``cancel_many`` and ``cancel_workflow`` do through a broker."""

from __future__ import annotations

import argparse
import sys

from tidemq import Settings

__all__ = ["register", "run_cancel"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tidemq cancel``."""
    cancel = sub.add_parser("cancel", help="cancel messages: pending ones are deleted; with --running, running "
                                           "ones are marked and their handlers stop (exit code 0: every one "
                                           "cancelled, 1: some were not)")
    cancel.add_argument("ids", nargs="+", type=int, metavar="ID", help="message ids (with --workflow: workflow ids)")
    cancel.add_argument("--running", action="store_true",
                        help="also stop running ones: the handler sees message.cancelled and the message ends "
                             "CANCELLED")
    cancel.add_argument("--workflow", action="store_true",
                        help="the ids name workflows (the id of each one's first step): each is cancelled whole")
    cancel.set_defaults(func=run_cancel)


def run_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq import Client

    bad = [id for id in args.ids if id <= 0]
    if bad:
        print(f"tidemq: an ID must be a positive id, got {bad[0]}", file=sys.stderr)
        return 2
    client = Client(settings)
    try:
        if args.workflow:
            counts = [client.cancel_workflow(id, running=args.running) for id in args.ids]
            for id, count in zip(args.ids, counts):
                print(f"workflow {id}: {count} step(s) removed or marked")
            return 0 if all(counts) else 1
        cancelled = client.cancel_many(args.ids, running=args.running)
    finally:
        client.close()
    why = "finished or gone" if args.running else "running (--running stops it), finished or gone"
    for id, done in zip(args.ids, cancelled):
        print(f"{id}: cancelled" if done else f"{id}: not cancelled: {why}")
    return 0 if all(cancelled) else 1
