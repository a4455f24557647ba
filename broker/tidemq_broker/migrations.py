"""Schema migrations: each step moves the schema one version forward; db/migrations/ has the
same steps as SQL for a DBA."""

from __future__ import annotations

from .schema import SCHEMA_VERSION
from .storage import Storage

__all__ = ["upgrade", "STEPS"]

# version -> name; the storage's ``migrate(version)`` holds each step's statements.
STEPS = {
    2: "lease_expire only while RUNNING; drop idx_message_lease_token and idx_message_status_id",
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
