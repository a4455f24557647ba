"""Principals of the SQL storage: the identities brokers that authenticate accept, stored with a
hash of their token."""

from __future__ import annotations

from datetime import datetime
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..errors import ValidationError, quote
from ..records import Principal
from ..schema import principal as p
from .database import SqlDatabase

__all__ = ["SqlPrincipals"]


def _principal(row) -> Principal:
    return Principal(row.name, row.role, tuple(t for t in row.topics.split(",") if t), row.token_hash, row.created,
                     row.revoked)


class SqlPrincipals:
    """Adding, listing and revoking principals; the active ones by token hash."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def add(self, name: str, role: str, topics: tuple[str, ...], token_hash: str, now: datetime) -> None:
        """Store a new principal. A revoked one of the same name is replaced; an active one is
        refused (``ValidationError``): revoke it first, so a token is never replaced silently."""

        def work(conn: Connection) -> None:
            row = conn.execute(select(p.c.revoked).where(p.c.name == name).with_for_update()).first()
            if row is not None and row.revoked is None:
                raise ValidationError(f"principal {quote(name)} exists; revoke it first to issue a new token")
            values = {"role": role, "topics": ",".join(topics), "token_hash": token_hash, "created": now,
                      "revoked": None}
            if row is None:
                conn.execute(insert(p).values(name=name, **values))
            else:
                conn.execute(update(p).where(p.c.name == name).values(**values))

        try:
            self._db.tx(work)
        except IntegrityError:
            raise ValidationError(f"principal {quote(name)} was added meanwhile") from None

    def revoke(self, name: str, now: datetime) -> bool:
        """Revoke ``name``; False when there is no active principal of that name."""
        return self._db.tx(lambda conn: conn.execute(
            update(p).where(p.c.name == name, p.c.revoked.is_(None)).values(revoked=now)).rowcount) == 1

    def list(self) -> list[Principal]:
        """Every principal, revoked ones included, by name."""
        return [_principal(r) for r in self._db.tx(lambda conn: conn.execute(select(p).order_by(p.c.name)).all())]

    def active(self) -> dict[str, Principal]:
        """Principals not revoked, by token hash (what a broker's cache holds)."""
        rows = self._db.tx(lambda conn: conn.execute(select(p).where(p.c.revoked.is_(None))).all())
        return {row.token_hash: _principal(row) for row in rows}
