"""Schema versions and the steps between them, shared by every SQL dialect.

A mixin of :class:`tidemq_broker.storages.sql.SqlStorage`. Each step is also kept as SQL for a
DBA in db/migrations/.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import func, insert, inspect, select, update

from .. import clock
from ..errors import ConfigurationError
from ..schema import message as m
from ..schema import schema_version as v

__all__ = ["SqlMigrations"]

_CHUNK = 10_000  # rows per UPDATE of a data step: keeps each transaction short on big tables


class SqlMigrations:
    """``schema_version`` and ``migrate`` of the SQL storages."""

    _tx: Callable[..., Any]
    engine: Any

    def schema_version(self) -> int:
        return self._tx(lambda conn: conn.execute(select(func.max(v.c.version))).scalar() or 0)

    def migrate(self, version: int) -> None:
        step = getattr(self, f"_to_{version}", None)
        if step is None:
            raise ConfigurationError(f"no schema step leads to version {version}")
        step()
        self._tx(lambda conn: conn.execute(insert(v).values(version=version, applied_at=clock.now())))

    def _to_2(self) -> None:
        """Version 2: lease_expire is NULL outside RUNNING, which lets one (topic, status,
        lease_expire) index serve lease expiry, the pull's read-back of what it leased and the
        console's pages; it replaces four indexes. Each index holding status costs two index
        writes per state change of every message."""
        upper = self._tx(lambda conn: conn.execute(select(func.max(m.c.id))).scalar() or 0)
        for start in range(0, upper + 1, _CHUNK):
            self._tx(lambda conn, lo=start: conn.execute(
                update(m).where(m.c.id >= lo, m.c.id < lo + _CHUNK, m.c.status != "RUNNING",
                                m.c.lease_expire.is_not(None)).values(lease_expire=None)))
        present = {ix["name"] for ix in inspect(self.engine).get_indexes(m.name)}
        with self.engine.begin() as conn:
            if "idx_message_topic_status_lease" not in present:
                conn.exec_driver_sql(f"CREATE INDEX idx_message_topic_status_lease ON {m.name} (topic, status, lease_expire)")
            for name in sorted(_REPLACED & present):
                # MySQL names the table in DROP INDEX; SQLite's index names are global.
                on = f" ON {m.name}" if conn.dialect.name in ("mysql", "mariadb") else ""
                conn.exec_driver_sql(f"DROP INDEX {name}{on}")


_REPLACED = {"idx_message_lease_token", "idx_message_status_id", "idx_message_status_lease", "idx_message_topic_status_id"}
