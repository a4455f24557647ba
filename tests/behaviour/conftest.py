"""Every behaviour scenario runs against both doubles: the StubBroker and an embedded broker."""

from __future__ import annotations

import shutil

import pytest

from .doubles import EmbeddedDouble, StubDouble


@pytest.fixture(scope="session")
def _schema_file(tmp_path_factory):
    """A SQLite file holding tidemq's empty schema: each scenario's broker starts on a copy of
    it, its own database, without creating the schema again (most of a broker's start here)."""
    from tidemq_broker.storages import open_storage

    path = tmp_path_factory.mktemp("behaviour-schema") / "schema.sqlite3"
    storage = open_storage(f"sqlite:///{path}")
    storage.schema.create_schema()
    storage.close()
    return path


@pytest.fixture(params=["stub", "embedded"])
def double(request, tmp_path):
    """A fresh double per scenario: a new StubBroker, or a new broker on its own SQLite file."""
    if request.param == "stub":
        made = StubDouble()
    else:
        shutil.copy(request.getfixturevalue("_schema_file"), tmp_path / "behaviour.sqlite3")
        made = EmbeddedDouble(tmp_path / "behaviour.sqlite3")
    yield made
    made.close()
