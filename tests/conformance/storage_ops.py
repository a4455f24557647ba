"""What the storage conformance tests share: rows to insert, and one call per operation with
the arguments most tests use."""

from __future__ import annotations

from tidemq import clock
from tidemq_broker.storage import LockRequest, NewRow, Shard, TopicSettings

__all__ = ["rows", "insert", "lock", "settings", "ack", "id_step"]


def rows(topic, n, delay=0.0, **kw):
    now = clock.now()
    return [NewRow(topic=topic, data=f'{{"n": {i}}}', effect_time=clock.after(now, delay),
                   retry_remaining=kw.get("retry", 0), retry_schedule=kw.get("schedule"),
                   unique_key=(f"{kw['key']}-{i}" if kw.get("key") else None))
            for i in range(n)]


def insert(storage, topic, n, **kw):
    return storage.messages.insert_messages(rows(topic, n, **kw), clock.now())


def lock(storage, topic, limit=100, rank=0, total=1, ttr=30, consumer="c1"):
    return storage.leases.lock_batch(LockRequest(Shard(topic, rank, total), consumer, ttr, clock.now(), limit=limit))


def settings(name):
    return TopicSettings(name)


def ack(storage, items):
    return storage.acks.ack(items, clock.now(), "c1", "b1", settings)


def id_step(storage) -> int:
    """How far apart one server's ids are (3 on a 3-node Galera cluster, 1 on one server)."""
    return storage.probes.id_step()
