"""Schema migrations: each step moves the schema one version forward; db/migrations/ has the
same steps as SQL for a DBA."""

from __future__ import annotations

import logging

from .schema import SCHEMA_VERSION
from .storage import Storage

__all__ = ["upgrade", "warn_if_behind", "STEPS"]

log = logging.getLogger(__name__)

# version -> name; the storage's ``migrate(version)`` holds each step's statements.
STEPS = {
    2: "lease_expire only while RUNNING; one (topic, status, lease_expire) index replaces four",
}


def upgrade(storage: Storage) -> list[str]:
    """Bring the schema to the current version; return the names of the steps applied.

    Version 1 is the initial schema. A new database is created at the current version.
    """
    storage.create_schema()
    applied = []
    for version in range(storage.schema_version() + 1, SCHEMA_VERSION + 1):
        storage.migrate(version)
        applied.append(f"{version}: {STEPS[version]}")
    return applied


def warn_if_behind(storage: Storage, who: str) -> None:
    """Log a warning when the database's schema is older than this code's.

    Nothing migrates on its own: brokers and consoles start in any order, and a step rewrites
    indexes on what may be a large table, so `tidemq db upgrade` is run once, on purpose.
    """
    found = storage.schema_version()
    if found < SCHEMA_VERSION:
        log.warning("the database schema is version %d, this %s expects %d: run `tidemq db upgrade` "
                    "(until then pulls, lease expiry and the console's pages are slower or fail)", found, who,
                    SCHEMA_VERSION)
