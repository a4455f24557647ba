"""Schema migrations: each step moves the schema one version forward; db/migrations/ has the
same steps as SQL for a DBA."""

from __future__ import annotations

from .storage import Storage

__all__ = ["upgrade"]


def upgrade(storage: Storage) -> list[str]:
    """Bring the schema to the current version; return the names of the steps applied.

    Version 1 is the initial schema, created by ``create_schema``; later versions add steps here.
    """
    storage.create_schema()
    return []
