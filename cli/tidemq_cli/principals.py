"""``tidemq auth``: add, list and revoke the principals brokers with TIDEMQ_AUTH=token accept."""

from __future__ import annotations

import argparse

from tidemq import clock
from tidemq.config import Settings

__all__ = ["register", "run"]


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``auth`` sub-command to ``sub``."""
    auth = sub.add_parser("auth", help="principals for brokers that authenticate (TIDEMQ_AUTH=token)")
    actions = auth.add_subparsers(dest="auth_action", required=True)
    add = actions.add_parser("add", help="add a principal and print its token (shown once, stored hashed)")
    add.add_argument("name", help="1-64 of A-Z a-z 0-9 . _ -")
    add.add_argument("--role", required=True, choices=["producer", "consumer", "admin"],
                     help="producer: Produce, Cancel, Requeue, PutSchedule; consumer: Pull, Ack, Touch, Extend, "
                          "Release; admin: all of them")
    add.add_argument("--topics", required=True, help="comma-separated topic patterns, e.g. 'orders.*' or '*'")
    actions.add_parser("list", help="list principals (never their tokens)")
    revoke = actions.add_parser("revoke", help="revoke a principal: its token stops working within seconds")
    revoke.add_argument("name")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq_broker.auth import check_name, check_role, new_token, parse_patterns, token_hash
    from tidemq_broker.storages import open_storage

    storage = open_storage(settings.db_url)
    try:
        store = storage.principals
        if args.auth_action == "add":
            name, role, topics = check_name(args.name), check_role(args.role), parse_patterns(args.topics)
            token = new_token()
            store.add(name, role, topics, token_hash(token), clock.now())
            print(token)
            print(f"principal {name} ({role}, topics {','.join(topics)}) added; the token above is shown only "
                  "once: give it to the client as TIDEMQ_TOKEN or in the file TIDEMQ_TOKEN_FILE names")
        elif args.auth_action == "list":
            print(f"{'name':<24} {'role':<9} {'created (UTC)':<24} {'revoked (UTC)':<24} topics")
            for p in store.list():
                revoked = p.revoked.isoformat(sep=" ", timespec="seconds") if p.revoked else "-"
                print(f"{p.name:<24} {p.role:<9} {p.created.isoformat(sep=' ', timespec='seconds'):<24} "
                      f"{revoked:<24} {','.join(p.topics)}")
        else:
            if not store.revoke(check_name(args.name), clock.now()):
                print(f"tidemq: no active principal named {args.name!r}")
                return 1
            print(f"principal {args.name} revoked: brokers refuse its token within seconds")
    finally:
        storage.close()
    return 0
