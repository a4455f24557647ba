"""security: produce and consume through a broker serving TLS and checking tokens, beside a
plaintext broker without authentication, in the same run (target: >= 0.8 x plaintext).

The principals cover ``bench.*``, not ``*``, so every Ack and Extend is authorized on the topics
of its messages: the costlier of the two authorization paths (the broker knows the topics of the
leases its own pulls granted; it reads any other's).
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from tidemq import clock

from .consume import _workers_seconds
from .env import Cluster, CpuMeter
from .produce import _broker_rate
from .report import Report

__all__ = ["run"]


def _principals(cluster: Cluster) -> dict[str, str]:
    from tidemq_broker.auth import new_token, token_hash
    from tidemq_broker.storages import open_storage

    storage = open_storage(cluster.db_url)
    try:
        tokens = {}
        for role in ("producer", "consumer"):
            tokens[role] = new_token()
            storage.principals.add(f"bench-{role}-{len(cluster.brokers)}", role, ("bench.*",),
                                   token_hash(tokens[role]), clock.now())
        return tokens
    finally:
        storage.close()


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    from tests.pki import Authority

    ca = Authority(Path(cluster.dir) / "pki")
    pair = ca.server()
    tokens = _principals(cluster)
    plain = cluster.brokers[0]
    secure = cluster.start_broker({"TIDEMQ_TLS_CERT": pair.cert, "TIDEMQ_TLS_KEY": pair.key, "TIDEMQ_AUTH": "token"})
    sides = {
        "plaintext": {"TIDEMQ_BROKERS": plain.address},  # type: ignore[attr-defined]
        "TLS + tokens": {"TIDEMQ_BROKERS": secure.address, "TIDEMQ_TLS_CA": ca.ca},  # type: ignore[attr-defined]
    }
    n, rounds = args.security_messages, args.rounds
    per = n // rounds // (args.produce_threads * args.produce_batch) * args.produce_threads * args.produce_batch
    try:
        produce_s = {side: 0.0 for side in sides}
        for r in range(rounds):
            for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                env = dict(sides[side], TIDEMQ_TOKEN=tokens["producer"]) if side != "plaintext" else sides[side]
                report.progress(f"round {r + 1}/{rounds}: produce through the {side} broker")
                rate, _ = _broker_rate(cluster, report, f"bench.sec.produce.{r}", per, args.produce_threads,
                                       args.produce_batch, client_env=env)
                produce_s[side] += per / rate
        consume_s = {side: 0.0 for side in sides}
        # The sides take turns, as the produce rounds do: a machine that slows down during the
        # scenario then weighs on both (workers start anew each round, outside the timing).
        for r in range(rounds):
            for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                env = sides[side]
                worker_env = dict(env, TIDEMQ_TOKEN=tokens["consumer"]) if side != "plaintext" else dict(env)
                topic = f"bench.sec.consume.{'tls' if side != 'plaintext' else 'plain'}"
                procs = cluster.start_workers(args.security_workers, topic, {**worker_env, "BENCH_THREADS":
                                              str(args.worker_threads), "BENCH_BATCH": str(args.worker_batch)})
                try:
                    cpu = CpuMeter({"brokers": [b.pid for b in cluster.brokers], "workers": [p.pid for p in procs]})
                    seconds, _ = _workers_seconds(cluster, report, topic, per, procs,
                                                  f"{side} round {r + 1}/{rounds}", cpu, "")
                    consume_s[side] += seconds
                finally:
                    cluster.stop_workers()
    finally:
        cluster.brokers.remove(secure)
        secure.stop()
    total = per * rounds
    for what, seconds in (("produce_many", produce_s), ("consume", consume_s)):
        rates = {side: total / s for side, s in seconds.items()}
        for side, rate in rates.items():
            report.record("security", f"{what} through the {side} broker", rate, "msg/s",
                          f"{args.produce_threads} threads x {args.produce_batch}" if what == "produce_many"
                          else f"{args.security_workers} workers")
        ratio = round(rates["TLS + tokens"] / rates["plaintext"], 3)
        report.record("security", f"{what} ratio TLS + tokens / plaintext", ratio, "x", f"{rounds} rounds")
        report.target("security", f"{what} TLS + tokens / plaintext", ratio, ">=", 0.8)
