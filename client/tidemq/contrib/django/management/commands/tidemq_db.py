"""``python manage.py tidemq_db init|upgrade``: tidemq's schema in ``TIDEMQ['DATABASE']``.

tidemq's tables are not Django models, so ``migrate`` and database routers leave them alone:
this command creates or migrates them in the database the ``TIDEMQ['DATABASE']`` alias (or
``--database``) names, by running ``tidemq db init|upgrade`` with ``TIDEMQ_DB_URL`` built from
that alias's settings and passed in the environment (never on the command line, where every
local user could read the password). It needs the ``tidemq`` command (``tidemq[django]``
installs it with the broker extra).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ...conf import MYSQL_ENGINES, database_alias


class Command(BaseCommand):
    help = "Create (init) or migrate (upgrade) tidemq's tables in the database TIDEMQ['DATABASE'] names."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["init", "upgrade"])
        parser.add_argument("--database", help="the alias to use instead of TIDEMQ['DATABASE']")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or database_alias()
        if alias is None:
            raise CommandError("name the database: TIDEMQ['DATABASE'] or --database ALIAS")
        if alias not in connections:
            raise CommandError(f"--database {alias!r} is not in settings.DATABASES")
        env = {**os.environ, "TIDEMQ_DB_URL": sqlalchemy_url(connections[alias].settings_dict)}
        done = subprocess.run([_tidemq(), "db", options["action"]], env=env, capture_output=True, text=True)
        if done.returncode:
            raise CommandError((done.stderr or done.stdout).strip())
        self.stdout.write(done.stdout.strip())


def sqlalchemy_url(database: dict[str, Any]) -> str:
    """The ``mysql+pymysql://`` URL of a Django MySQL database's settings (what brokers take as
    ``TIDEMQ_DB_URL``)."""
    if database.get("ENGINE") not in MYSQL_ENGINES:
        raise CommandError(f"tidemq's tables live in MySQL/MariaDB, not {database.get('ENGINE')}")
    options = database.get("OPTIONS") or {}
    host, query = database.get("HOST") or "127.0.0.1", {}
    socket = options.get("unix_socket") or (host if host.startswith("/") else "")
    if socket:
        host, query["unix_socket"] = "localhost", socket
    if options.get("charset"):
        query["charset"] = options["charset"]
    user = quote(database.get("USER") or "", safe="")
    password = quote(database.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{database['PORT']}" if database.get("PORT") else ""
    name = quote(database.get("NAME") or "", safe="")
    return f"mysql+pymysql://{auth}{host}{port}/{name}" + (f"?{urlencode(query)}" if query else "")


def _tidemq() -> str:
    # The command installed beside this interpreter first: a virtualenv's, not another one's.
    beside = Path(sys.executable).with_name("tidemq")
    found = str(beside) if beside.exists() else shutil.which("tidemq")
    if not found:
        raise CommandError("the tidemq command is not installed: pip install 'tidemq[django]'")
    return found
