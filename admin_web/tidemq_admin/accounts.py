"""Console users: names, roles and salted password hashes (never the passwords)."""

from __future__ import annotations

import functools
import re
from typing import Optional

from werkzeug.security import check_password_hash, generate_password_hash

from tidemq import clock
from tidemq.config import Settings
from tidemq.errors import ValidationError, quote
from tidemq_broker.storages.admin_sql import AdminSqlStore, AdminUser

__all__ = ["ROLES", "MIN_PASSWORD_LENGTH", "add_user", "authenticate", "check_password", "ensure_first_admin"]

ROLES = ("admin", "viewer")
MIN_PASSWORD_LENGTH = 12
_NAME_RE = re.compile(r"[A-Za-z0-9._@-]{1,64}")
# Checked when the name is unknown, so a wrong name costs as much time as a wrong password.
_DUMMY_HASH = generate_password_hash("tidemq-no-such-user")


@functools.lru_cache(maxsize=1)
def _common_passwords() -> frozenset[str]:
    """The 30,000 most common passwords of leaked lists (zxcvbn's list), lower case."""
    from zxcvbn.frequency_lists import FREQUENCY_LISTS

    return frozenset(FREQUENCY_LISTS["passwords"])


def check_password(password: str, name: str = "") -> None:
    """Raise ValidationError naming the rule ``password`` breaks: at least 12 characters, not a
    common password (also with digits or symbols added before or after, like
    ``Password1234!``, or repeated, like ``monkeymonkey``), not the user name, and not one character or one short run repeated."""
    password = password or ""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValidationError(f"password must be at least {MIN_PASSWORD_LENGTH} characters long")
    lower = password.lower()
    core = re.sub(r"^[\W\d_]+|[\W\d_]+$", "", lower)
    common = _common_passwords()
    repeated = re.fullmatch(r"(.+?)\1+", core)
    if lower in common or core in common or (repeated and repeated.group(1) in common):
        raise ValidationError("password is a common password (or one with digits or symbols added); choose another")
    if name and name.lower() in lower:
        raise ValidationError("password must not contain the user name")
    if re.fullmatch(r"(.{1,4})\1+", lower) or re.fullmatch(r"\d+", lower) and _is_run(lower):
        raise ValidationError("password must not be one character or one short run repeated, or a run of digits")


def _is_run(digits: str) -> bool:
    """True for a run of digits going up or down by one, like 123456789012."""
    steps = {(int(b) - int(a)) % 10 for a, b in zip(digits, digits[1:])}
    return steps in ({1}, {9})


def check_user(name: str, password: str, role: str) -> None:
    """Raise ValidationError naming the rule that ``name``, ``password`` or ``role`` breaks."""
    if not _NAME_RE.fullmatch(name or ""):
        raise ValidationError("user name must be 1 to 64 characters of [A-Za-z0-9._@-]")
    check_password(password, name)
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {quote(role)}")


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
