"""Schema migrations: each step moves the schema one version forward; db/migrations/ has the
same steps as SQL for a DBA."""

from __future__ import annotations

import logging

from .schema import SCHEMA_VERSION
from .storage import Schema
from .storages.migrations import STEPS

__all__ = ["upgrade", "warn_if_behind"]

log = logging.getLogger(__name__)

def upgrade(schema: Schema) -> list[str]:
    """Bring the schema to the current version; return the names of the steps applied.

    Version 1 is the initial schema. A new database is created at the current version.
    """
    schema.create_schema()
    applied = []
    current = schema.schema_version()
    for step in STEPS:
        if step.version > current:
            schema.migrate(step.version)
            applied.append(f"{step.version}: {step.name}")
    return applied


def warn_if_behind(schema: Schema, who: str) -> None:
    """Log a warning when the database's schema is older than this code's.

    Nothing migrates on its own: brokers and consoles start in any order, and a step rewrites
    indexes on what may be a large table, so `tidemq db upgrade` is run once, on purpose.
    """
    found = schema.schema_version()
    if found < SCHEMA_VERSION:
        log.warning("the database schema is version %d, this %s expects %d: run `tidemq db upgrade` "
                    "(until then pulls, lease expiry and the console's pages are slower or fail)", found, who,
                    SCHEMA_VERSION)
