"""Where the message table lives: TIDEMQ_DB_URL turned into a JDBC source for Spark and a
PyMySQL connection for the few statements the driver sends itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import unquote, urlsplit

from tidemq.errors import ConfigurationError

from .session import JDBC_DRIVER

__all__ = ["Database"]

_SCHEMES = ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql")


@dataclass(frozen=True)
class Database:
    """A MySQL/MariaDB database named by a SQLAlchemy URL such as
    ``mysql+pymysql://user:pw@host:3306/tidemq``."""

    host: str
    port: int
    name: str
    user: str
    password: str

    @classmethod
    def from_url(cls, url: str) -> "Database":
        """Parse ``url``; raise ConfigurationError for anything but a MySQL/MariaDB URL."""
        parts = urlsplit(url)
        if "," in parts.netloc.rpartition("@")[2]:
            # Its single-run guard is a GET_LOCK, which a Galera cluster does not share between
            # nodes: two runs through two nodes would not be kept apart.
            raise ConfigurationError(
                "the pipeline reads one database address: give it one node of the cluster, e.g. "
                "mysql+pymysql://user:password@db1:3306/tidemq (TIDEMQ_DB_URL names several)")
        if parts.scheme not in _SCHEMES:
            raise ConfigurationError(
                f"the pipeline reads MySQL/MariaDB over JDBC: TIDEMQ_DB_URL must look like "
                f"mysql+pymysql://user:password@host:3306/tidemq, got scheme {parts.scheme or '(none)'!r}"
            )
        name = parts.path.lstrip("/")
        if not name or not parts.hostname:
            raise ConfigurationError("TIDEMQ_DB_URL must name a host and a database, "
                                     "e.g. mysql+pymysql://root@127.0.0.1:3306/tidemq")
        return cls(parts.hostname, parts.port or 3306, unquote(name), unquote(parts.username or "root"),
                   unquote(parts.password or ""))

    @property
    def jdbc_url(self) -> str:
        # jdbc:mysql:// makes Spark quote names with backticks; with jdbc:mariadb:// it uses
        # double quotes, which MariaDB reads as strings.
        return (f"jdbc:mysql://{self.host}:{self.port}/{self.name}"
                "?permitMysqlScheme&useServerPrepStmts=false&rewriteBatchedStatements=true")

    def jdbc_options(self, **extra: Any) -> dict[str, str]:
        """Options for ``spark.read.format("jdbc")``."""
        options = {"url": self.jdbc_url, "driver": JDBC_DRIVER, "user": self.user, "password": self.password,
                   "fetchsize": "10000"}
        options.update({key: str(value) for key, value in extra.items()})
        return options

    def connect(self, autocommit: bool = True, database: Optional[str] = None):
        """A PyMySQL connection (UTC session, utf8mb4)."""
        try:
            import pymysql
        except ModuleNotFoundError:
            raise ConfigurationError("the pipeline needs PyMySQL: pip install 'tidemq[pipeline]'") from None
        conn = pymysql.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                               database=database or self.name, autocommit=autocommit, charset="utf8mb4",
                               init_command="SET time_zone = '+00:00'")
        return conn

    def describe(self) -> str:
        """host:port/name, without the password (for log lines)."""
        return f"{self.host}:{self.port}/{self.name}"
