"""The storage interface is roles: every implementation gives each role a component with the
role's methods, as the protocol spells them, and the rest of tidemq reaches them through the
factory's Storage, never through an implementation's modules."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from tidemq_broker.storage import Storage
from tidemq_broker.storages import open_storage
from tidemq_broker.storages.memory import open_memory_storage

ROOT = Path(__file__).resolve().parents[2]
ROLES = [field.name for field in dataclasses.fields(Storage) if field.name != "closer"]


def _methods(protocol: type) -> list[str]:
    """The protocol's operations, those of the protocols it extends included."""
    bases = [base for base in protocol.__mro__ if getattr(base, "_is_protocol", False) and base is not typing.Protocol]
    return list(dict.fromkeys(name for base in bases for name, value in vars(base).items()
                              if callable(value) and not name.startswith("_")))


@pytest.fixture(params=["sqlite", "memory"])
def storage(request, tmp_path):
    store = open_storage(f"sqlite:///{tmp_path}/roles.sqlite3") if request.param == "sqlite" else open_memory_storage()
    yield store
    store.close()


def test_each_role_is_a_component_with_the_protocols_methods_and_signatures(storage):
    hints = typing.get_type_hints(Storage)
    assert len(ROLES) == 13
    for role in ROLES:
        protocol = hints[role]
        methods = _methods(protocol)
        assert methods, role
        component = getattr(storage, role)
        for name in methods:
            expected = inspect.signature(getattr(protocol, name))
            got = inspect.signature(getattr(type(component), name))
            assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == \
                [(p.name, p.kind, p.default) for p in expected.parameters.values()], f"{role}.{name}"
        # A role's component does one role's work: no other role's operations beside it.
        others = {name for other in ROLES if other != role for name in _methods(hints[other])}
        assert not (others - set(methods)) & set(_methods(type(component))), role


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else \
                ".".join(path.relative_to(ROOT).with_suffix("").parts[1:][: -node.level] + (node.module,))
            names.add(base)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_only_the_storages_package_imports_its_implementations():
    """The broker, the console and the CLI open a storage through the factory: no module of
    theirs imports a SQL component or reaches a database object behind a Storage. (enqueue runs
    in the caller's own transaction, and `tidemq db upgrade` lists the schema steps.)"""
    allowed = {"tidemq_broker.storages", "tidemq_broker.storages.memory", "tidemq_broker.storages.enqueue",
               "tidemq_broker.storages.migrations"}
    violations = []
    for folder in ("broker/tidemq_broker", "admin_web/tidemq_admin", "cli/tidemq_cli"):
        for path in (ROOT / folder).rglob("*.py"):
            if "storages" in path.relative_to(ROOT).parts:
                continue
            bad = {name for name in _imports(path) if name.startswith("tidemq_broker.storages") and name not in allowed}
            if bad or ".db." in path.read_text() or "storage.db" in path.read_text():
                violations.append(f"{path.relative_to(ROOT)}: {sorted(bad) or 'reaches .db'}")
    assert not violations, "\n".join(violations)
