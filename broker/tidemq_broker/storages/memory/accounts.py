"""Principals and the console's sign-in state in memory: only hashes of tokens, session ids and
sign-in keys are kept, as in the SQL storage."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Callable, Optional, Sequence

from ...errors import ValidationError, quote
from ...records import Principal, SessionUser
from ..sessions import TOUCH_EVERY, digest
from .state import MemoryState

__all__ = ["MemoryPrincipals", "MemorySessions"]


class MemoryPrincipals:
    """Adding, listing and revoking principals; the active ones by token hash."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def add(self, name: str, role: str, topics: tuple[str, ...], token_hash: str, now: datetime) -> None:
        with self._state.lock:
            stored = self._state.principals.get(name)
            if stored is not None and stored.revoked is None:
                raise ValidationError(f"principal {quote(name)} exists; revoke it first to issue a new token")
            # Stored as the SQL column keeps them: a comma-separated list, empty patterns dropped.
            patterns = tuple(t for t in ",".join(topics).split(",") if t)
            self._state.principals[name] = Principal(name, role, patterns, token_hash, now, None)

    def revoke(self, name: str, now: datetime) -> bool:
        with self._state.lock:
            stored = self._state.principals.get(name)
            if stored is None or stored.revoked is not None:
                return False
            self._state.principals[name] = Principal(stored.name, stored.role, stored.topics, stored.token_hash,
                                                     stored.created, now)
            return True

    def list(self) -> list[Principal]:
        with self._state.lock:
            return [p for _, p in sorted(self._state.principals.items())]

    def active(self) -> dict[str, Principal]:
        with self._state.lock:
            return {p.token_hash: p for p in self._state.principals.values() if p.revoked is None}


class MemorySessions:
    """Sessions (create, resolve, end one, end all of a user) and sign-in attempts per key."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def create(self, user_name: str, now: datetime) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._state.lock:
            self._state.sessions[digest(session_id)] = {"user_name": user_name, "created": now, "last_seen": now}
        return session_id

    def resolve(self, session_id: str, now: datetime, idle: timedelta, lifetime: timedelta) -> Optional[SessionUser]:
        key = digest(session_id)
        with self._state.lock:
            row = self._state.sessions.get(key)
            user = self._state.users.get(row["user_name"]) if row is not None else None
            if row is None or user is None:
                return None
            if row["last_seen"] < now - idle or row["created"] < now - lifetime:
                del self._state.sessions[key]
                return None
            if row["last_seen"] < now - TOUCH_EVERY:  # a page view is a read, mostly
                row["last_seen"] = now
            return SessionUser(user.name, user.role)

    def end(self, session_id: str) -> None:
        with self._state.lock:
            self._state.sessions.pop(digest(session_id), None)

    def end_all(self, user_name: str) -> int:
        with self._state.lock:
            gone = [key for key, row in self._state.sessions.items() if row["user_name"] == user_name]
            for key in gone:
                del self._state.sessions[key]
            return len(gone)

    def count(self, user_name: str) -> int:
        with self._state.lock:
            return sum(1 for row in self._state.sessions.values() if row["user_name"] == user_name)

    def sweep(self, now: datetime, idle: timedelta, lifetime: timedelta, failures_kept: timedelta) -> None:
        with self._state.lock:
            for key in [key for key, row in self._state.sessions.items()
                        if row["last_seen"] < now - idle or row["created"] < now - lifetime]:
                del self._state.sessions[key]
            for key in [key for key, (_, last) in self._state.failures.items() if last < now - failures_kept]:
                del self._state.failures[key]

    def reserve_attempt(self, keys: Sequence[str], now: datetime,
                        wait_for: Callable[[dict[str, tuple[int, datetime]]], float]) -> float:
        by_hash = {digest(k): k for k in keys}
        with self._state.lock:
            for key in by_hash:
                self._state.failures.setdefault(key, [0, now])
            wait = wait_for({by_hash[key]: (n, last) for key in by_hash
                             for n, last in [self._state.failures[key]] if n})
            if wait > 0:
                return wait
            for key in by_hash:
                self._state.failures[key] = [self._state.failures[key][0] + 1, now]
            return 0.0

    def attempt_succeeded(self, clear: Sequence[str], undo: Sequence[str]) -> None:
        with self._state.lock:
            for key in map(digest, clear):
                self._state.failures.pop(key, None)
            for key in map(digest, undo):
                if key in self._state.failures and self._state.failures[key][0] > 0:
                    self._state.failures[key][0] -= 1
