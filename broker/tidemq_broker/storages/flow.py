"""Flow control in the lock: a topic's running limit, its rate and its per-key limit.

A lock of a topic with limits first locks the topic's row (``SELECT ... FOR UPDATE``), so every
limited lock of that topic, on every broker and for every shard, runs one after another, and
what it counts is what the others committed: the RUNNING messages (a range of
``(topic, status, lease_expire)``) and the rate's token bucket kept in the row. Acks, releases
and lease expiries lower the counts without the row lock; they can only make room. Topics
without limits never come here and take no topic lock.

Nothing here depends on ids: the shard rule is the dialect's, the per-key choice goes by the
order of the lock itself (priority, effect_time, id) and names the chosen ids.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, select, update

from tidemq.lifecycle import Change, MessageStatus

from ..flow import FIRST_DEPTH, KEY_WINDOW, refill, within_key_limit
from ..records import FlowLimits, LeasedMessage, LockRequest, Shard
from ..schema import message as m
from ..schema import topic as t
from .claims import due_candidates, lease_rows
from .dialect import SqlDialect

__all__ = ["lock_limited"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value


def lock_limited(conn: Connection, dialect: SqlDialect, request: LockRequest, change: Change,
                 due_by: datetime) -> list[LeasedMessage]:
    """Lease up to ``request.limit`` due messages of its shard (and stranded ones of other shards,
    as the hint allows) as the topic's stored limits allow."""
    topic, now = request.topic, request.now
    row = conn.execute(select(t.c.max_running, t.c.rate_per_second, t.c.max_running_per_key, t.c.rate_tokens,
                              t.c.rate_at).where(t.c.name == topic).with_for_update()).first()
    stored = FlowLimits(row.max_running, row.rate_per_second, row.max_running_per_key) if row else FlowLimits()
    allowed = request.limit
    if stored.max_running is not None:
        running = conn.execute(select(func.count()).select_from(m)
                               .where(m.c.topic == topic, m.c.status == _RUNNING)).scalar() or 0
        allowed = min(allowed, stored.max_running - running)
    tokens = 0.0
    if stored.rate_per_second is not None:
        tokens = refill(row.rate_tokens, row.rate_at, stored.rate_per_second, now)
        allowed = min(allowed, int(tokens))
    if allowed <= 0:
        return []
    if stored.max_running_per_key is not None:
        ids = _per_key(conn, dialect, request.shard, allowed, stored.max_running_per_key, due_by, now)
    else:
        ids = [c.id for c in due_candidates(conn, dialect, request.shard, allowed, due_by, now)]
    taken = lease_rows(conn, topic, ids, change)
    if stored.rate_per_second is not None and taken:
        # rate_at is the last start: a gap since longer than CATCH_UP_SECONDS is idleness.
        conn.execute(update(t).where(t.c.name == topic).values(rate_tokens=tokens - len(taken), rate_at=now))
    return taken


def _per_key(conn: Connection, dialect: SqlDialect, shard: Shard, allowed: int, per_key: int, due_by: datetime,
             now: datetime) -> list[int]:
    """Due messages in the lock's order, skipping those whose key already has ``per_key``
    RUNNING (counting what this lock takes). Messages without a key are not limited by it.

    The lock looks ``KEY_WINDOW`` candidates deep for each message it may take, but reads
    ``FIRST_DEPTH`` first: unless keys at their limit fill that much, it has its choice, the
    same as from the whole window (the choice is a scan in the lock's order), for a fifth of the
    rows."""
    chosen: list[int] = []
    for depth in (FIRST_DEPTH, KEY_WINDOW):
        candidates = due_candidates(conn, dialect, shard, allowed * depth, due_by, now, columns=[m.c.flow_key])
        keys = sorted({c.flow_key for c in candidates if c.flow_key is not None})
        held: dict[str, int] = {}
        if keys:
            held = dict(conn.execute(select(m.c.flow_key, func.count())
                                     .where(m.c.topic == shard.topic, m.c.status == _RUNNING, m.c.flow_key.in_(keys))
                                     .group_by(m.c.flow_key)).all())
        chosen = within_key_limit([(c.id, c.flow_key) for c in candidates], held, per_key, allowed)
        if len(chosen) == allowed or len(candidates) < allowed * depth:
            break  # a full choice, or every due candidate was read
    return chosen
