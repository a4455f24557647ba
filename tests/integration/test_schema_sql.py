"""db/schema.sql (what a DBA reads and applies) must be exactly the schema the code creates."""

from __future__ import annotations

import re
from pathlib import Path

from tidemq_broker.schema import metadata
from tidemq_broker.storages import open_storage

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "db" / "schema.sql"


def _tables(mariadb, database):
    result = {}
    for (name,) in mariadb.execute("SHOW TABLES", database):
        ddl = mariadb.execute(f"SHOW CREATE TABLE `{name}`", database)[0][1]
        ddl = re.sub(r" AUTO_INCREMENT=\d+", "", ddl)
        # Index order follows creation order, which differs between the two routes: compare
        # the definition lines as a set.
        result[name] = sorted(line.strip().rstrip(",") for line in ddl.splitlines())
    return result


def test_schema_sql_matches_the_metadata(mariadb):
    from_code = mariadb.create_database("drift_code")
    storage = open_storage(from_code)
    storage.schema.create_schema()
    storage.close()
    mariadb.create_database("drift_sql")
    for statement in SCHEMA_SQL.read_text().split(";\n"):
        body = "\n".join(line for line in statement.splitlines() if not line.startswith("--")).strip()
        if body:
            mariadb.execute(body, "drift_sql")
    code_tables, sql_tables = _tables(mariadb, "drift_code"), _tables(mariadb, "drift_sql")
    assert set(code_tables) == {t.name for t in metadata.sorted_tables}
    assert set(sql_tables) == set(code_tables), "db/schema.sql and schema.py define different tables"
    for name, ddl in code_tables.items():
        assert sql_tables[name] == ddl, f"{name} differs between db/schema.sql and broker/tidemq_broker/schema.py"
