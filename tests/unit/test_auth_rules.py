"""Roles, topic patterns and the security settings, without a server."""

from __future__ import annotations

from datetime import datetime

import pytest

from tidemq import Settings
from tidemq.errors import ConfigurationError, PermissionDeniedError, ValidationError
from tidemq_broker.auth import CALLER, authorize, bearer_token, checks_topics, new_token, parse_patterns, token_hash
from tidemq_broker.storage import Principal


def _as(role, topics):
    return Principal("p1", role, tuple(topics), "h", datetime(2026, 1, 1))


def test_patterns_are_topic_characters_and_stars():
    assert parse_patterns(" orders.* , billing ") == ("orders.*", "billing")
    for bad in ("", " , ", "orders.[a]", "orders?", "a b", "x" * 256):
        with pytest.raises(ValidationError):
            parse_patterns(bad)


def test_authorize_checks_the_role_then_every_topic():
    reset = CALLER.set(_as("producer", ["orders.*", "audit"]))
    try:
        authorize("Produce", ["orders.eu.new", "audit"])
        with pytest.raises(PermissionDeniedError, match="may not call Pull"):
            authorize("Pull", ["orders.a"])
        with pytest.raises(PermissionDeniedError, match="on topic 'billing'"):
            authorize("Produce", ["orders.a", "billing"])
        with pytest.raises(PermissionDeniedError):
            authorize("Produce", ["auditx"])  # a pattern without * matches only itself
        assert checks_topics()
    finally:
        CALLER.reset(reset)
    authorize("Cancel", ["anything"])  # no caller: authentication is off
    assert not checks_topics()
    reset = CALLER.set(_as("admin", ["*"]))
    try:
        assert not checks_topics()  # "*" covers every topic: no lookup needed
        authorize("Release", ["any.topic"])
    finally:
        CALLER.reset(reset)


def test_tokens_are_random_and_stored_hashed():
    a, b = new_token(), new_token()
    assert a != b and a.startswith("tmq_") and len(a) > 40
    assert token_hash(a) != a and len(token_hash(a)) == 64
    assert bearer_token([("authorization", f"Bearer {a}")]) == a
    assert bearer_token([("authorization", f"bearer {a}")]) == a
    assert bearer_token([("authorization", a)]) == "" and bearer_token([]) == ""


def test_security_settings(tmp_path):
    token = new_token()
    s = Settings.from_env({"TIDEMQ_TOKEN": token, "TIDEMQ_AUTH": "Token", "TIDEMQ_ADMIN_PASSWORD": "pw-secret"})
    assert s.token == token and s.auth == "token"
    assert token not in repr(s) and "pw-secret" not in repr(s)
    path = tmp_path / "token"
    path.write_text(f"{token}\n")
    assert Settings.from_env({"TIDEMQ_TOKEN_FILE": str(path)}).token == token
    with pytest.raises(ConfigurationError, match="TIDEMQ_TOKEN_FILE: cannot read"):
        Settings.from_env({"TIDEMQ_TOKEN_FILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigurationError, match="not a tidemq token") as info:
        Settings.from_env({"TIDEMQ_TOKEN": "hunter2-is-my-password"})
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigurationError, match="TIDEMQ_AUTH must be one of none, token"):
        Settings.from_env({"TIDEMQ_AUTH": "password"})
    with pytest.raises(ConfigurationError, match="TIDEMQ_TLS_CERT and TIDEMQ_TLS_KEY go together"):
        Settings.from_env({"TIDEMQ_TLS_CERT": "/x.pem"})


def test_database_passwords_are_masked_and_may_come_from_a_file(tmp_path):
    from tidemq.config import has_password, masked_url

    url = "mysql+pymysql://app:s3cr@t:pw@db1:3306,db2:3306/tidemq"
    assert masked_url(url) == "mysql+pymysql://app:***@db1:3306,db2:3306/tidemq" and has_password(url)
    assert masked_url("mysql+pymysql://app@db1/tidemq") == "mysql+pymysql://app@db1/tidemq"
    assert not has_password("sqlite:///x.sqlite3")
    path = tmp_path / "db-url"
    path.write_text(url + "\n")
    settings = Settings.from_env({"TIDEMQ_DB_URL_FILE": str(path)})
    assert settings.db_url == url
    assert "s3cr" not in repr(settings) and "app:***@db1" in repr(settings)


def test_a_password_on_the_command_line_is_warned_about_and_masked(tmp_path):
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/x.sqlite3"
    result = subprocess.run([sys.executable, "-m", "tidemq_cli.main", "--db-url", url, "db", "init"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "password" not in result.stderr
    secret = "mysql+pymysql://app:hunter2-pw@127.0.0.1:1/tidemq"
    result = subprocess.run([sys.executable, "-m", "tidemq_cli.main", "--db-url", secret, "auth", "list"],
                            capture_output=True, text=True, timeout=60)
    assert "carries a password on the command line" in result.stderr and "app:***@127.0.0.1" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr


@pytest.mark.parametrize("url", ["mysql+foo://app:hunter2-pw@db/tidemq",
                                 "mysql+pymysql://app:hunter2-pw@db:port/tidemq",
                                 "mysql+pymysql://app:hunter2-pw@[::1/tidemq", "sqlite://app:hunter2-pw@/x",
                                 "postgresql://app:hunter2-pw@db/tidemq"])
def test_an_unusable_database_url_is_refused_in_one_line_without_its_password(url, tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "tidemq_cli.main", "db", "init"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "TIDEMQ_DB_URL": url}, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert not list(tmp_path.iterdir()), "a refused URL left a file behind"
    assert "hunter2" not in result.stdout + result.stderr
    assert result.stderr.startswith("tidemq: ") and "Traceback" not in result.stderr
    assert "mysql+pymysql://user:pw@host:3306/db" in result.stderr  # the expected form


def test_an_unreachable_database_is_one_line_naming_the_reason(tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "tidemq_cli.main", "db", "init"], capture_output=True, text=True,
                            timeout=60,
                            env={**os.environ, "TIDEMQ_DB_URL": "mysql+pymysql://app:hunter2-pw@127.0.0.1:1/x"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the database is unavailable" in result.stderr and "hunter2" not in result.stderr


def test_put_schedule_is_for_producers_and_admins_of_the_topic():
    for role in ("producer", "admin"):
        reset = CALLER.set(_as(role, ["reports.*"]))
        try:
            authorize("PutSchedule", ["reports.daily"])
            with pytest.raises(PermissionDeniedError, match="on topic 'billing'"):
                authorize("PutSchedule", ["reports.daily", "billing"])  # moving a schedule off another topic
        finally:
            CALLER.reset(reset)
    reset = CALLER.set(_as("consumer", ["*"]))
    try:
        with pytest.raises(PermissionDeniedError, match="may not call PutSchedule"):
            authorize("PutSchedule", ["reports.daily"])
    finally:
        CALLER.reset(reset)
