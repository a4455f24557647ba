"""The brokers' principals and the console's users, sessions and sign-in counts, on every storage
(memory, SQLite, MariaDB, Galera)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tidemq import clock
from tidemq.errors import ValidationError

IDLE, LIFETIME = timedelta(hours=2), timedelta(hours=12)


@pytest.fixture
def storage(any_storage):
    return any_storage


def test_principals_are_added_revoked_and_replaced_only_once_revoked(storage):
    principals, now = storage.principals, clock.now()
    principals.add("svc", "producer", ("orders.*", "billing"), "a" * 64, now)
    with pytest.raises(ValidationError, match="exists; revoke it first"):
        principals.add("svc", "admin", ("*",), "b" * 64, now)
    principals.add("ops", "admin", ("*",), "c" * 64, now)
    assert [(p.name, p.role, p.topics) for p in principals.list()] == \
        [("ops", "admin", ("*",)), ("svc", "producer", ("orders.*", "billing"))]
    assert set(principals.active()) == {"a" * 64, "c" * 64}
    assert principals.revoke("svc", now) and not principals.revoke("svc", now) and not principals.revoke("nobody", now)
    assert set(principals.active()) == {"c" * 64}
    principals.add("svc", "consumer", ("orders.*",), "d" * 64, now)  # a revoked name takes a new token
    assert principals.active()["d" * 64].role == "consumer" and "a" * 64 not in principals.active()


def test_a_session_lasts_while_used_and_ends_idle_old_signed_out_or_with_a_new_password(storage):
    console, sessions, now = storage.console, storage.sessions, clock.now()
    assert console.save_user("amy", "hash-1", "viewer", now) is True
    sid = sessions.create("amy", now)
    assert sessions.resolve(sid, now + timedelta(hours=1), IDLE, LIFETIME).role == "viewer"
    assert sessions.resolve(sid, now + timedelta(hours=2, minutes=59), IDLE, LIFETIME) is not None  # seen at 1 h
    assert sessions.resolve(sid, now + timedelta(hours=5), IDLE, LIFETIME) is None  # idle since
    assert sessions.resolve(sid, now + timedelta(hours=1), IDLE, LIFETIME) is None  # and gone
    assert sessions.resolve("unknown", now, IDLE, LIFETIME) is None
    first, second = sessions.create("amy", now), sessions.create("amy", now)
    assert sessions.count("amy") == 2
    sessions.end(first)
    assert sessions.resolve(first, now, IDLE, LIFETIME) is None and sessions.count("amy") == 1
    assert console.save_user("amy", "hash-2", "admin", now) is False  # a new password ends the others
    assert sessions.resolve(second, now, IDLE, LIFETIME) is None and sessions.count("amy") == 0
    assert (console.get_user("amy").password_hash, console.get_user("amy").role) == ("hash-2", "admin")
    third = sessions.create("amy", now)
    assert sessions.end_all("amy") == 1 and sessions.resolve(third, now, IDLE, LIFETIME) is None
    old = sessions.create("amy", now)
    sessions.sweep(now + LIFETIME + timedelta(seconds=1), IDLE, LIFETIME, timedelta(days=1))
    assert sessions.count("amy") == 0 and sessions.resolve(old, now, IDLE, LIFETIME) is None


def test_sign_in_attempts_are_counted_before_the_check_and_taken_back_when_right(storage):
    sessions, now = storage.sessions, clock.now()
    seen = []

    def wait_for(counts):
        seen.append(counts)
        return 5.0 if counts.get("pair:amy", (0, now))[0] >= 3 else 0.0

    assert [sessions.reserve_attempt(["pair:amy", "addr:x"], now, wait_for) for _ in range(4)] == [0, 0, 0, 5.0]
    assert seen[0] == {} and seen[3] == {"pair:amy": (3, now), "addr:x": (3, now)}
    sessions.attempt_succeeded(clear=["pair:amy"], undo=["addr:x"])
    assert sessions.reserve_attempt(["pair:amy", "addr:x"], now, wait_for) == 0.0
    assert seen[-1] == {"addr:x": (2, now)}  # the pair forgotten, the address's attempt taken back
    sessions.sweep(now + timedelta(days=2), IDLE, LIFETIME, timedelta(days=1))
    sessions.reserve_attempt(["addr:x"], now + timedelta(days=2), wait_for)
    assert seen[-1] == {}  # counts nobody added to for a day are gone
