"""``tidemq result ID [--wait S]``: a message's status, progress and result from the shell."""

from __future__ import annotations

import argparse
import json
import sys

from tidemq import Settings
from tidemq.lifecycle import MessageStatus

__all__ = ["register", "run_result"]

#: Exit codes: 0 SUCCESS, 1 FAIL, 3 CANCELLED, 4 not found, 5 not finished (NEW or RUNNING).
EXIT = {MessageStatus.SUCCESS: 0, MessageStatus.FAIL: 1, MessageStatus.CANCELLED: 3}


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tidemq result``."""
    result = sub.add_parser("result", help="a message's status, progress and result (exit code: 0 SUCCESS, "
                                           "1 FAIL, 3 CANCELLED, 4 not found, 5 not finished)")
    result.add_argument("id", type=int, help="the message id")
    result.add_argument("--wait", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds (at most 60 per call) for the message to finish")
    result.set_defaults(func=run_result)


def run_result(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq import Client
    from tidemq.limits import MAX_WAIT

    if args.id <= 0:
        print(f"tidemq: ID must be a positive message id, got {args.id}", file=sys.stderr)
        return 2
    if not 0 <= args.wait:
        print(f"tidemq: --wait must be 0 or more seconds, got {args.wait}", file=sys.stderr)
        return 2
    client = Client(settings)
    try:
        [state] = client.results([args.id], wait=min(args.wait, MAX_WAIT))
    finally:
        client.close()
    if not state.found:
        print(f"tidemq: message {args.id} is not stored (never produced, cancelled before it ran, or removed)",
              file=sys.stderr)
        return 4
    assert state.status is not None
    print(f"status: {state.status.value}")
    if state.progress is not None:
        total = "?" if state.progress.total is None else f"{state.progress.total:g}"
        print(f"progress: {state.progress.done:g}/{total} {state.progress.note}".rstrip())
    if state.result is not None:
        label = "error" if state.status is MessageStatus.FAIL else "result"
        print(f"{label}: {json.dumps(json.loads(state.result), indent=2, ensure_ascii=False)}")
    return EXIT.get(state.status, 5)
