"""The console's sign-in state: server-side sessions and the shared count of failed sign-ins.

A browser holds a random session id; only its SHA-256 is stored, so a copy of the table signs
nobody in. Every console process on the database sees the same rows: a session ended by one
(sign-out, password change) is ended for all of them, and a guesser cannot spread attempts over
several processes.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Callable, Optional, Sequence

from sqlalchemy import Connection, delete, func, insert, select, update

from ..records import SessionUser
from ..schema import admin_session as s
from ..schema import admin_user as u
from ..schema import login_failure as f
from .database import SqlDatabase

__all__ = ["SqlSessions", "digest", "TOUCH_EVERY"]

# A session's last_seen is written at most this often: a page view is a read, not a write.
TOUCH_EVERY = timedelta(seconds=60)


def digest(text: str) -> str:
    """How a session id or a sign-in key is stored: its SHA-256, in hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class SqlSessions:
    """Sessions (create, resolve, end one, end all of a user) and sign-in attempts per key."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    # -- sessions ----------------------------------------------------------------------------
    def create(self, user_name: str, now: datetime) -> str:
        """Start a session for ``user_name``; returns the id to hand to the browser (shown once)."""
        session_id = secrets.token_urlsafe(32)
        self._db.tx(lambda c: c.execute(insert(s).values(id_hash=digest(session_id), user_name=user_name,
                                                         created=now, last_seen=now)))
        return session_id

    def resolve(self, session_id: str, now: datetime, idle: timedelta, lifetime: timedelta) -> Optional[SessionUser]:
        """The user of a live session, or None when the id is unknown, ended, idle longer than
        ``idle`` or older than ``lifetime`` (such a row is deleted)."""
        key = digest(session_id)

        def work(conn: Connection) -> Optional[SessionUser]:
            row = conn.execute(select(s.c.created, s.c.last_seen, u.c.name, u.c.role)
                               .join(u, u.c.name == s.c.user_name).where(s.c.id_hash == key)).first()
            if row is None:
                return None
            if row.last_seen < now - idle or row.created < now - lifetime:
                conn.execute(delete(s).where(s.c.id_hash == key))
                return None
            if row.last_seen < now - TOUCH_EVERY:
                conn.execute(update(s).where(s.c.id_hash == key).values(last_seen=now))
            return SessionUser(row.name, row.role)

        return self._db.tx(work)

    def end(self, session_id: str) -> None:
        """End one session (sign-out)."""
        self._db.tx(lambda c: c.execute(delete(s).where(s.c.id_hash == digest(session_id))))

    def end_all(self, user_name: str) -> int:
        """End every session of ``user_name`` (its password changed); returns how many."""
        return self._db.tx(lambda c: c.execute(delete(s).where(s.c.user_name == user_name)).rowcount)

    def count(self, user_name: str) -> int:
        """How many sessions ``user_name`` has (live or not yet swept)."""
        return self._db.tx(lambda c: c.execute(select(func.count()).select_from(s)
                                               .where(s.c.user_name == user_name)).scalar() or 0)

    def sweep(self, now: datetime, idle: timedelta, lifetime: timedelta, failures_kept: timedelta) -> None:
        """Delete expired sessions and failure counts nobody has added to for ``failures_kept``."""
        def work(conn: Connection) -> None:
            conn.execute(delete(s).where((s.c.last_seen < now - idle) | (s.c.created < now - lifetime)))
            conn.execute(delete(f).where(f.c.last_failure < now - failures_kept))

        self._db.tx(work)

    # -- failed sign-ins ---------------------------------------------------------------------
    def reserve_attempt(self, keys: Sequence[str], now: datetime,
                        wait_for: Callable[[dict[str, tuple[int, datetime]]], float]) -> float:
        """Count a sign-in attempt as a failure of each of ``keys`` before its password is
        checked, unless ``wait_for(failures so far)`` says to wait: then return that wait and
        count nothing. One transaction holding the keys' rows: parallel attempts are counted one
        after another, so sending guesses at once gets no more of them through.

        The rows are inserted first (with no failures) when missing: a locking read of a row that
        does not exist yet locks nothing under READ COMMITTED, so the first attempts of a new key
        would each have read no failures and gone ahead together."""
        hashes = sorted(digest(k) for k in keys)  # one order: no deadlock between processes
        by_hash = {digest(k): k for k in keys}

        def work(conn: Connection) -> float:
            self._db.dialect.insert_failure_keys(
                conn, [{"key_hash": key, "failures": 0, "last_failure": now} for key in hashes])
            rows = conn.execute(select(f.c.key_hash, f.c.failures, f.c.last_failure)
                                .where(f.c.key_hash.in_(hashes)).with_for_update()).all()
            wait = wait_for({by_hash[r.key_hash]: (r.failures, r.last_failure) for r in rows if r.failures})
            if wait > 0:
                return wait
            conn.execute(update(f).where(f.c.key_hash.in_(hashes)).values(failures=f.c.failures + 1, last_failure=now))
            return 0.0

        return self._db.tx(work)

    def attempt_succeeded(self, clear: Sequence[str], undo: Sequence[str]) -> None:
        """The password was right: forget the failures of ``clear``, and take back the attempt
        counted on ``undo`` (a key whose earlier failures stay)."""
        def work(conn: Connection) -> None:
            conn.execute(delete(f).where(f.c.key_hash.in_([digest(k) for k in clear])))
            conn.execute(update(f).where(f.c.key_hash.in_([digest(k) for k in undo]), f.c.failures > 0)
                         .values(failures=f.c.failures - 1))

        self._db.tx(work)
