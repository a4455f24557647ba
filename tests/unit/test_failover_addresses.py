"""Several database addresses in one URL: how they are read, and which ones are refused."""

from __future__ import annotations

import pytest

from tidemq.errors import ConfigurationError
from tidemq_broker.storages.failover import split_addresses


def test_a_url_with_one_address_is_left_alone():
    url = "mysql+pymysql://u:p@db1:3306/tidemq?charset=utf8mb4"
    assert split_addresses(url) == (url, [])


def test_several_addresses_keep_their_order_and_default_port():
    first, addresses = split_addresses("mysql+pymysql://u:p@db1:3307,db2,db3:3309/tidemq?charset=utf8mb4")
    assert addresses == [("db1", 3307), ("db2", 3306), ("db3", 3309)]
    assert first == "mysql+pymysql://u:p@db1:3307/tidemq?charset=utf8mb4"


def test_a_password_with_at_signs_and_commas_stays_in_the_userinfo():
    first, addresses = split_addresses("mysql+pymysql://u:p@ss,w@rd@10.0.0.1:3306,10.0.0.2:3306/tidemq")
    assert addresses == [("10.0.0.1", 3306), ("10.0.0.2", 3306)]
    assert first == "mysql+pymysql://u:p@ss,w@rd@10.0.0.1:3306/tidemq"


def test_a_url_without_credentials():
    first, addresses = split_addresses("mysql+pymysql://a:1,b:2/db")
    assert addresses == [("a", 1), ("b", 2)] and first == "mysql+pymysql://a:1/db"


@pytest.mark.parametrize("hosts", ["db1:3306,db2:port", "db1:3306,", "db1:3306,:3306", "db1:3306,db2:70000"])
def test_a_malformed_address_is_refused_naming_it_and_the_expected_form(hosts):
    with pytest.raises(ConfigurationError, match="host1:3306,host2:3306") as info:
        split_addresses(f"mysql+pymysql://u:p@{hosts}/tidemq")
    assert "u:p" not in str(info.value)  # the password never appears in the error
