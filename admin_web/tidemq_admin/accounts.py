"""Console users: names, roles and salted password hashes (never the passwords)."""

from __future__ import annotations

import functools
import re
from typing import Optional

from werkzeug.security import check_password_hash, generate_password_hash

from tidemq import clock
from tidemq.config import Settings
from tidemq.errors import ValidationError, quote
from tidemq_broker.storage import AdminUser, ConsoleStore

__all__ = ["ROLES", "MIN_PASSWORD_LENGTH", "MIN_GUESSES", "add_user", "authenticate", "check_password",
           "ensure_first_admin"]

ROLES = ("admin", "viewer")
MIN_PASSWORD_LENGTH = 12
#: The guesses zxcvbn must estimate for a password: its top score. A person's password that the
#: length and the common-password list let through and that falls below it is a pattern: a run
#: (abcdefghijklmn), a keyboard walk (qwertyuiopasdf), a date (2024-01-01-2024), a repeat.
MIN_GUESSES = 1e10
#: How a refusal names the kinds of pieces zxcvbn found.
_PATTERNS = {
    "sequence": "a run of letters or digits",
    "spatial": "a walk along the keyboard",
    "repeat": "a repeated character or run",
    "date": "a date",
    "regex": "a year",
    "dictionary": "common words, names or passwords",
}
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
    common password (also with digits or symbols added before or after, like ``Password1234!``,
    or repeated, like ``monkeymonkey``), not containing the user name, and hard to guess: zxcvbn
    must estimate at least ``MIN_GUESSES`` guesses, which refuses runs of letters or digits,
    keyboard walks, repeats, dates and a common word with a few digits."""
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
    from zxcvbn import zxcvbn

    # zxcvbn takes at most 72 characters: a longer password is judged by its start.
    estimate = zxcvbn(password[:72], user_inputs=[name] if name else [])
    if estimate["guesses"] < MIN_GUESSES:
        parts = [_PATTERNS[m["pattern"]] for m in estimate["sequence"] if m["pattern"] in _PATTERNS]
        made_of = ", ".join(dict.fromkeys(parts)) or "too few characters of too few kinds"
        raise ValidationError(
            f"password is easy to guess ({made_of}): zxcvbn estimates {estimate['guesses']:.0e} guesses, "
            f"and at least {MIN_GUESSES:.0e} are needed; add an uncommon word or two")


def check_user(name: str, password: str, role: str) -> None:
    """Raise ValidationError naming the rule that ``name``, ``password`` or ``role`` breaks."""
    if not _NAME_RE.fullmatch(name or ""):
        raise ValidationError("user name must be 1 to 64 characters of [A-Za-z0-9._@-]")
    check_password(password, name)
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {quote(role)}")


def add_user(store: ConsoleStore, name: str, password: str, role: str) -> bool:
    """Create a user or reset its password and role; True when it was created."""
    check_user(name, password, role)
    return store.save_user(name, generate_password_hash(password), role, clock.now())


def authenticate(store: ConsoleStore, name: str, password: str) -> Optional[AdminUser]:
    """The user when ``password`` is right, else None (in about the same time either way)."""
    user = store.get_user(name) if _NAME_RE.fullmatch(name or "") else None
    ok = check_password_hash(user.password_hash if user else _DUMMY_HASH, password or "")
    return user if user and ok else None


def ensure_first_admin(store: ConsoleStore, settings: Settings) -> Optional[str]:
    """Create the admin named by TIDEMQ_ADMIN_USER / TIDEMQ_ADMIN_PASSWORD if it does not exist.

    An existing user keeps its password: the variables only bootstrap an empty console.
    """
    if not settings.admin_user:
        return None
    if store.get_user(settings.admin_user) is None:
        add_user(store, settings.admin_user, settings.admin_password, "admin")
    return settings.admin_user
