"""Console users: names, roles and salted password hashes (never the passwords)."""

from __future__ import annotations

import re
from typing import Optional

from werkzeug.security import check_password_hash, generate_password_hash

from tidemq import clock
from tidemq.config import Settings
from tidemq.errors import ValidationError
from tidemq_broker.storages.admin_sql import AdminSqlStore, AdminUser

__all__ = ["ROLES", "MIN_PASSWORD_LENGTH", "add_user", "authenticate", "ensure_first_admin"]

ROLES = ("admin", "viewer")
MIN_PASSWORD_LENGTH = 8
_NAME_RE = re.compile(r"[A-Za-z0-9._@-]{1,64}")
# Checked when the name is unknown, so a wrong name costs as much time as a wrong password.
_DUMMY_HASH = generate_password_hash("tidemq-no-such-user")


def check_user(name: str, password: str, role: str) -> None:
    """Raise ValidationError naming the rule that ``name``, ``password`` or ``role`` breaks."""
    if not _NAME_RE.fullmatch(name or ""):
        raise ValidationError("user name must be 1 to 64 characters of [A-Za-z0-9._@-]")
    if len(password or "") < MIN_PASSWORD_LENGTH:
        raise ValidationError(f"password must be at least {MIN_PASSWORD_LENGTH} characters long")
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {role!r}")


def add_user(store: AdminSqlStore, name: str, password: str, role: str) -> bool:
    """Create a user or reset its password and role; True when it was created."""
    check_user(name, password, role)
    return store.save_user(name, generate_password_hash(password), role, clock.now())


def authenticate(store: AdminSqlStore, name: str, password: str) -> Optional[AdminUser]:
    """The user when ``password`` is right, else None (in about the same time either way)."""
    user = store.get_user(name) if _NAME_RE.fullmatch(name or "") else None
    ok = check_password_hash(user.password_hash if user else _DUMMY_HASH, password or "")
    return user if user and ok else None


def ensure_first_admin(store: AdminSqlStore, settings: Settings) -> Optional[str]:
    """Create the admin named by TIDEMQ_ADMIN_USER / TIDEMQ_ADMIN_PASSWORD if it does not exist.

    An existing user keeps its password: the variables only bootstrap an empty console.
    """
    if not settings.admin_user:
        return None
    if store.get_user(settings.admin_user) is None:
        add_user(store, settings.admin_user, settings.admin_password, "admin")
    return settings.admin_user
