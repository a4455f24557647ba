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
from typing import Optional

from sqlalchemy import Connection, func, select, update

from tidemq.lifecycle import Change, MessageStatus

from ..schema import message as m
from ..schema import topic as t
from ..storage import FlowLimits, LeasedMessage, LockHint
from .claims import due_candidates, lease_rows
from .dialect import SqlDialect

__all__ = ["lock_limited", "BURST_SECONDS", "CATCH_UP_SECONDS", "refill"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value
#: The rate's bucket starts, after an idle spell, with this many seconds of tokens (at least
#: one): a topic that was idle starts a tenth of a second's worth at once, not a burst.
BURST_SECONDS = 0.1
#: While consumers keep leasing, the bucket keeps up to this many seconds of tokens, so pulls
#: that come late on a busy machine catch up instead of losing the tokens that accrued meanwhile
#: (a bucket of a tenth of a second loses all but that much of every longer gap). A gap longer
#: than this is idleness: the bucket starts over at BURST_SECONDS.
CATCH_UP_SECONDS = 1.0
#: How many due messages a per-key lock looks at for each one it may take: keys at their limit
#: are passed over, up to this depth.
_KEY_WINDOW = 10


def refill(tokens: Optional[float], at: Optional[datetime], rate: float, now: datetime) -> float:
    """The bucket's tokens at ``now``: what it held at ``at`` plus ``rate`` per second since, at
    most CATCH_UP_SECONDS' worth. A bucket never used, or left alone longer than
    CATCH_UP_SECONDS, starts over at BURST_SECONDS' worth; a clock that went back adds nothing."""
    burst = max(1.0, rate * BURST_SECONDS)
    if tokens is None or at is None or (now - at).total_seconds() > CATCH_UP_SECONDS:
        return burst
    return min(max(burst, rate * CATCH_UP_SECONDS), tokens + max(0.0, (now - at).total_seconds()) * rate)


def lock_limited(conn: Connection, dialect: SqlDialect, topic: str, rank: int, total: int, limit: int,
                 change: Change, due_by: datetime, now: datetime, hint: LockHint = LockHint()) -> list[LeasedMessage]:
    """Lease up to ``limit`` due messages of the shard (and stranded ones of other shards, as
    ``hint`` allows) as the topic's stored limits allow."""
    row = conn.execute(select(t.c.max_running, t.c.rate_per_second, t.c.max_running_per_key, t.c.rate_tokens,
                              t.c.rate_at).where(t.c.name == topic).with_for_update()).first()
    stored = FlowLimits(row.max_running, row.rate_per_second, row.max_running_per_key) if row else FlowLimits()
    allowed = limit
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
        ids = _per_key(conn, dialect, topic, rank, total, allowed, stored.max_running_per_key, due_by, now, hint)
    else:
        ids = [c.id for c in due_candidates(conn, dialect, topic, rank, total, allowed, due_by, now, hint)]
    taken = lease_rows(conn, topic, ids, change)
    if stored.rate_per_second is not None and taken:
        # rate_at is the last start: a gap since longer than CATCH_UP_SECONDS is idleness.
        conn.execute(update(t).where(t.c.name == topic).values(rate_tokens=tokens - len(taken), rate_at=now))
    return taken


def _per_key(conn: Connection, dialect: SqlDialect, topic: str, rank: int, total: int, allowed: int,
             per_key: int, due_by: datetime, now: datetime, hint: LockHint) -> list[int]:
    """Due messages in the lock's order, skipping those whose key already has ``per_key``
    RUNNING (counting what this lock takes). Messages without a key are not limited by it."""
    candidates = due_candidates(conn, dialect, topic, rank, total, allowed * _KEY_WINDOW, due_by, now, hint,
                                columns=[m.c.flow_key])
    keys = sorted({c.flow_key for c in candidates if c.flow_key is not None})
    held: dict[str, int] = {}
    if keys:
        held = dict(conn.execute(select(m.c.flow_key, func.count())
                                 .where(m.c.topic == topic, m.c.status == _RUNNING, m.c.flow_key.in_(keys))
                                 .group_by(m.c.flow_key)).all())
    chosen: list[int] = []
    for candidate in candidates:
        if candidate.flow_key is not None:
            if held.get(candidate.flow_key, 0) >= per_key:
                continue
            held[candidate.flow_key] = held.get(candidate.flow_key, 0) + 1
        chosen.append(candidate.id)
        if len(chosen) == allowed:
            break
    return chosen
