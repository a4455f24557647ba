"""``manage.py tidemq_db`` hands ``tidemq db`` the URL of a Django MySQL database's settings."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from tidemq.contrib.django.management.commands.tidemq_db import sqlalchemy_url

MYSQL = "django.db.backends.mysql"


def test_tcp_with_a_password_that_needs_quoting():
    url = sqlalchemy_url({"ENGINE": MYSQL, "NAME": "shop", "USER": "app", "PASSWORD": "p@ss:w/rd", "HOST": "db1",
                          "PORT": 3307, "OPTIONS": {"charset": "utf8mb4"}})
    assert url == "mysql+pymysql://app:p%40ss%3Aw%2Frd@db1:3307/shop?charset=utf8mb4"


def test_a_unix_socket_as_host_or_option():
    assert sqlalchemy_url({"ENGINE": MYSQL, "NAME": "shop", "USER": "app", "HOST": "/run/mysqld/mysqld.sock"}) == \
        "mysql+pymysql://app@localhost/shop?unix_socket=%2Frun%2Fmysqld%2Fmysqld.sock"
    assert sqlalchemy_url({"ENGINE": MYSQL, "NAME": "shop", "OPTIONS": {"unix_socket": "/tmp/m.sock"}}) == \
        "mysql+pymysql://localhost/shop?unix_socket=%2Ftmp%2Fm.sock"


def test_another_engine_is_refused_by_name():
    with pytest.raises(CommandError, match="MySQL/MariaDB, not django.db.backends.postgresql"):
        sqlalchemy_url({"ENGINE": "django.db.backends.postgresql", "NAME": "shop"})
