"""A broker's cached view of the topic table."""

from __future__ import annotations

import threading
import time
from typing import Iterable

from tidemq import clock
from .storage import TopicSettings, TopicStore

__all__ = ["TopicCache"]


class TopicCache:
    """Topic settings, re-read from the database at most every ``ttl`` seconds.

    Topics are created with default settings the first time a message of them is produced.
    """

    def __init__(self, store: TopicStore, ttl: float = 5.0) -> None:
        self._store = store
        self._ttl = ttl
        self._lock = threading.Lock()
        self._settings: dict[str, TopicSettings] = {}
        self._loaded_at = 0.0

    def get(self, name: str) -> TopicSettings:
        """The settings of ``name`` (defaults when it has no row)."""
        self._refresh_if_stale()
        return self._settings.get(name) or TopicSettings(name)

    def ensure(self, names: Iterable[str]) -> None:
        """Make sure each topic has a settings row (one query per topic per broker lifetime)."""
        missing = {n for n in names if n not in self._settings}
        if missing:
            self._store.ensure_topics(sorted(missing), clock.now())
            self.refresh()

    def refresh(self) -> None:
        """Re-read every topic now."""
        settings = {s.name: s for s in self._store.list_topics()}
        with self._lock:
            self._settings = settings
            self._loaded_at = time.monotonic()

    def _refresh_if_stale(self) -> None:
        if time.monotonic() - self._loaded_at > self._ttl:
            try:
                self.refresh()
            except Exception:  # keep serving the cached view while the database is away
                self._loaded_at = time.monotonic()
