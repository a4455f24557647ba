"""The pipeline's command line and its start-up checks (no Spark session needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tidemq.errors import ConfigurationError, ValidationError
from tidemq_pipeline.database import Database
from tidemq_pipeline.restore import parse_time
from tidemq_pipeline.session import check_prerequisites

TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]


def test_missing_jdbc_jar_names_the_debian_package(tmp_path):
    with pytest.raises(ConfigurationError, match="apt-get install libmariadb-java"):
        check_prerequisites(str(tmp_path / "mariadb-java-client.jar"))


def test_missing_java_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ConfigurationError, match="openjdk-17-jre-headless"):
        check_prerequisites()


def test_database_url_must_be_mysql():
    db = Database.from_url("mysql+pymysql://u:p%40ss@10.0.0.5:3307/tidemq")
    assert (db.host, db.port, db.user, db.password, db.name) == ("10.0.0.5", 3307, "u", "p@ss", "tidemq")
    assert db.jdbc_url.startswith("jdbc:mysql://10.0.0.5:3307/tidemq")
    with pytest.raises(ConfigurationError, match="mysql\\+pymysql://user:password@host:3306/tidemq"):
        Database.from_url("sqlite:///tidemq.sqlite3")
    with pytest.raises(ConfigurationError, match="one database address") as info:
        Database.from_url("mysql+pymysql://u:secret@db1:3306,db2:3306/tidemq")
    assert "secret" not in str(info.value)


def test_since_must_be_an_iso_time():
    assert parse_time("2024-03-01T12:30:00Z", "--since").hour == 12
    with pytest.raises(ValidationError, match="--since must be an ISO date"):
        parse_time("yesterday", "--since")


def test_cli_reports_a_missing_jar_before_starting_spark(mysql_url, tmp_path):
    result = subprocess.run(TIDEMQ + ["--db-url", mysql_url, "pipeline", "report", "--master", "local[1]",
                                      "--jdbc-jar", str(tmp_path / "none.jar")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "libmariadb-java" in result.stderr and "Traceback" not in result.stderr
