"""One local Spark session for every Spark test (start-up costs ~10 s on two cores)."""

from __future__ import annotations

import pytest

from tidemq_pipeline.database import Database


@pytest.fixture(scope="session")
def spark():
    from tidemq_pipeline.session import spark_session

    session = spark_session("local[2]", app="tidemq-tests", shuffle_partitions=4)
    yield session
    session.stop()


@pytest.fixture
def db(mysql_url):
    """The test's truncated MariaDB database, as the pipeline addresses it."""
    database = Database.from_url(mysql_url)
    conn = database.connect()
    with conn.cursor() as cur:
        cur.execute("DELETE FROM tidemq_archive_batch")  # the manifest, in case truncate() predates it
    conn.close()
    return database
