"""How the MySQL dialect opens and drops connections: TLS only when the URL names it, and no
traceback for a rollback on a connection the server had already dropped. No server."""

from __future__ import annotations

import logging
import sys

import pymysql

from tidemq_broker.storages.mysql import _LostConnectionResets, _tls_args


def test_tls_is_used_when_the_url_names_it_and_not_opportunistically():
    assert _tls_args("mysql+pymysql://u:p@db:3306/tidemq") == {"ssl_disabled": True}
    assert _tls_args("mysql+pymysql://u:p@db:3306/tidemq?ssl_ca=/etc/ca.pem") == {}
    assert _tls_args("mysql+pymysql://u:p@db:3306/tidemq?charset=utf8mb4&ssl_cert=/c.pem&ssl_key=/k.pem") == {}


def _reset_record(error: BaseException) -> logging.LogRecord:
    try:
        raise error
    except type(error):
        info = sys.exc_info()
    return logging.LogRecord("sqlalchemy.pool.impl.QueuePool", logging.ERROR, __file__, 1,
                             "Exception during reset or similar", (), info)


def test_a_failed_reset_of_a_dropped_connection_is_not_logged_and_any_other_is():
    keep = _LostConnectionResets().filter
    assert not keep(_reset_record(pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")))
    assert not keep(_reset_record(pymysql.err.InterfaceError(0, "")))
    assert keep(_reset_record(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded")))
    assert keep(_reset_record(RuntimeError("a bug")))
    assert keep(logging.LogRecord("sqlalchemy.pool.impl.QueuePool", logging.INFO, __file__, 1, "other", (), None))
