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
])
def test_bad_settings_name_the_variable(env, words):
    with pytest.raises(ConfigurationError, match=words):
        Settings.from_env(env)
