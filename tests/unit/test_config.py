"""Settings come from the environment in one place and fail clearly."""

from __future__ import annotations

import pytest

from tidemq.config import DEFAULT_DB_URL, Settings
from tidemq.errors import ConfigurationError


def test_defaults_are_the_embedded_mode():
    s = Settings.from_env({})
    assert s.db_url == DEFAULT_DB_URL and s.zk_hosts == "" and s.zk_root == "/tidemq" and s.brokers == ()


def test_environment_and_overrides():
    env = {"TIDEMQ_DB_URL": "mysql+pymysql://u@h/db", "TIDEMQ_ZK_HOSTS": "a:1,b:2", "TIDEMQ_BROKERS": "x:1, y:2",
           "TIDEMQ_ZK_ROOT": "/q", "TIDEMQ_MAX_DATA_BYTES": "2048"}
    s = Settings.from_env(env, zk_root="/other", brokers=None)
    assert s.brokers == ("x:1", "y:2") and s.zk_root == "/other" and s.max_data_bytes == 2048


@pytest.mark.parametrize("env, words", [
    ({"TIDEMQ_ZK_ROOT": "tidemq"}, "absolute path"),
    ({"TIDEMQ_MAX_DATA_BYTES": "lots"}, "must be numbers"),
    ({"TIDEMQ_MAX_DATA_BYTES": "0"}, "between 1 and"),
    ({"TIDEMQ_PRODUCE_IN_FLIGHT": "0"}, "TIDEMQ_PRODUCE_IN_FLIGHT must be between 1 and 64"),
    ({"TIDEMQ_PRODUCE_IN_FLIGHT": "two"}, "must be numbers"),
    ({"TIDEMQ_MAX_REQUEST_BYTES": "1000"}, "TIDEMQ_MAX_REQUEST_BYTES must be between 65536 and 67108864"),
    ({"TIDEMQ_MAX_REQUEST_BYTES": str(128 << 20)}, "what clients send at most"),
])
def test_bad_settings_name_the_variable(env, words):
    with pytest.raises(ConfigurationError, match=words):
        Settings.from_env(env)


def test_the_request_limit_is_read_from_the_environment():
    assert Settings.from_env({}).max_request_bytes == 64 << 20
    assert Settings.from_env({"TIDEMQ_MAX_REQUEST_BYTES": str(4 << 20)}).max_request_bytes == 4 << 20


def test_produce_in_flight_is_read_from_the_environment():
    assert Settings.from_env({}).produce_in_flight == 2
    assert Settings.from_env({"TIDEMQ_PRODUCE_IN_FLIGHT": "8"}).produce_in_flight == 8


def test_a_direct_client_keeps_twice_as_many_flushes_open_as_its_producer_commits():
    from tidemq.direct import produce_flushes

    assert produce_flushes(Settings.from_env({"TIDEMQ_PRODUCE_IN_FLIGHT": "3"})) == 3
    assert produce_flushes(Settings.from_env({"TIDEMQ_PRODUCE_IN_FLIGHT": "3", "TIDEMQ_PRODUCE": "unary"})) == 3
    assert produce_flushes(Settings.from_env({"TIDEMQ_PRODUCE_IN_FLIGHT": "3", "TIDEMQ_PRODUCE": "direct"})) == 6


@pytest.mark.parametrize("ahead", [-1, 10.5, float("nan")])
def test_a_consumer_ahead_window_outside_0_to_10_seconds_is_refused(ahead):
    from tidemq import mq_consumer

    with pytest.raises(ConfigurationError, match="ahead must be between 0 and 10"):
        mq_consumer("t.ahead.bad", ahead=ahead)


def test_a_consumer_may_lease_ahead_whatever_its_ttr():
    from tidemq.consumer import clear_registry, mq_consumer, registered_consumers

    clear_registry()
    mq_consumer("t.ahead.ok", ttr=1, ahead=5)(lambda m: None)
    mq_consumer("t.ahead.off", ahead=0)(lambda m: None)
    assert [(c.ttr, c.ahead) for c in registered_consumers()] == [(1.0, 5.0), (60.0, 0.0)]
    clear_registry()


def test_zk_auth_is_read_from_the_environment_and_masked_by_repr():
    assert Settings.from_env({}).zk_auth == ""
    s = Settings.from_env({"TIDEMQ_ZK_AUTH": "ops:pa:ss"})  # the password may hold a colon
    assert s.zk_auth == "ops:pa:ss"
    assert "zk_auth='ops:***'" in repr(s) and "pa:ss" not in repr(s) and "pa:ss" not in str(s)
    assert "zk_auth" not in repr(Settings.from_env({}))
    assert Settings.from_env({"TIDEMQ_ZK_AUTH": "ops:x"}, zk_auth="other:y").zk_auth == "other:y"


@pytest.mark.parametrize("value", ["no-colon-secret", ":only-secret", "user-only:"])
def test_malformed_zk_auth_names_the_form_and_never_echoes_the_secret(value):
    with pytest.raises(ConfigurationError, match="TIDEMQ_ZK_AUTH .*user:password") as refused:
        Settings.from_env({"TIDEMQ_ZK_AUTH": value})
    assert "secret" not in str(refused.value) and "user-only" not in str(refused.value)


def test_the_cli_reads_zk_auth_from_a_file_never_from_argv(tmp_path, capsys):
    from tidemq_cli.main import _parser, _settings, main

    secret = tmp_path / "zk-auth"
    secret.write_text("ops:file-pass \n")
    args = _parser().parse_args(["--zk-auth-file", str(secret), "db", "init"])
    assert _settings(args).zk_auth == "ops:file-pass "  # only the line end is dropped
    secret.write_text("no-colon-file-pass\n")
    assert main(["--zk-auth-file", str(secret), "db", "init"]) == 2
    err = capsys.readouterr().err
    assert "user:password" in err and "file-pass" not in err
    assert main(["--zk-auth-file", str(tmp_path / "missing"), "db", "init"]) == 2
    assert "cannot read" in capsys.readouterr().err
