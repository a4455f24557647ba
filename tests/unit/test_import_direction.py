"""Imports flow one way: cli -> admin_web -> broker -> client; the pipeline stands apart."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# package -> packages it must never import
FORBIDDEN = {
    "client/tidemq": {"tidemq_broker", "tidemq_admin", "tidemq_pipeline", "tidemq_cli"},
    "broker/tidemq_broker": {"tidemq_admin", "tidemq_pipeline", "tidemq_cli"},
    "admin_web/tidemq_admin": {"tidemq_pipeline", "tidemq_cli"},
    "pipeline/tidemq_pipeline": {"tidemq_broker", "tidemq_admin", "tidemq_cli"},
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_package_imports_against_the_direction():
    checked = 0
    violations = []
    for folder, forbidden in FORBIDDEN.items():
        for path in (ROOT / folder).rglob("*.py"):
            checked += 1
            bad = _imports(path) & forbidden
            if bad:
                violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert checked > 20
    assert not violations, "\n".join(violations)



def test_only_contrib_imports_the_frameworks_it_integrates():
    """``tidemq.contrib.<framework>`` is an optional extra: the rest of the client package imports
    neither the framework nor contrib, so the base install never needs Django."""
    violations = []
    for path in (ROOT / "client/tidemq").rglob("*.py"):
        if "contrib" in path.relative_to(ROOT / "client/tidemq").parts:
            continue
        names = _imports(path) | {n for n in _dotted_imports(path) if n.startswith("tidemq.contrib")}
        bad = names & {"django", "fastapi", "starlette"} | {n for n in names if n.startswith("tidemq.contrib")}
        if bad:
            violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def _dotted_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(("tidemq." if node.level else "") + node.module)
    return names


def _module_names(path: Path, packages: set[str]) -> set[str]:
    """String constants in ``path`` that are a module path of one of ``packages`` (what
    importlib.import_module would be given), docstrings and prose aside."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", node.value) and node.value.split(".")[0] in packages:
            names.add(node.value)
    return names


def test_the_client_names_the_broker_package_only_to_forward_what_writes_the_database():
    """tidemq.enqueue and the direct produce path write to the database, which is the broker
    package's job: the client forwards them by module name (``tidemq.transactional``,
    ``tidemq.direct``), the two exceptions to the direction."""
    from tidemq import direct, transactional

    forbidden = FORBIDDEN["client/tidemq"]
    named = {path.relative_to(ROOT).as_posix(): found for path in (ROOT / "client/tidemq").rglob("*.py")
             if (found := _module_names(path, forbidden))}
    assert named == {"client/tidemq/transactional.py": {"tidemq_broker.enqueue"},
                     "client/tidemq/direct.py": {"tidemq_broker.direct"}}
    assert transactional._implementation().__module__ == "tidemq_broker.enqueue"
    assert importlib.import_module(direct._MODULE).DirectProducer.__module__ == "tidemq_broker.direct"


PACKAGES = {"client": "tidemq", "broker": "tidemq_broker", "admin_web": "tidemq_admin", "cli": "tidemq_cli",
            "pipeline": "tidemq_pipeline"}


def _module_graph() -> tuple[dict[str, set[str]], set[str]]:
    """Every module of the project -> the project's modules it imports (at any depth of the file,
    function-level imports too); and the names that are packages (``__init__``)."""
    files, packages = {}, set()
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
                packages.add(".".join(parts))
            files[".".join(parts)] = path

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name.split(".") if name in packages else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module or ""
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else known(base)
                               for alias in node.names)
        graph[name] = {target for target in targets if target and target != name}
    return graph, packages


def test_no_import_cycle_between_modules():
    """Two modules that import each other (even inside a function) are one concept split badly, or
    a shared piece that belongs in a third module. A package's ``__init__`` is left out: the import
    system runs it before any of its modules anyway."""
    graph, packages = _module_graph()
    assert len(graph) > 100
    cycles, done = [], set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycles.append(" -> ".join(path[path.index(name):] + [name]))
            return
        if name in done:
            return
        for target in sorted(graph[name] - packages):
            visit(target, path + [name])
        done.add(name)

    for name in sorted(set(graph) - packages):
        visit(name, [])
    assert not cycles, "\n".join(cycles)


def test_the_shared_modules_import_without_grpc_or_kazoo():
    """The broker, the console and the Spark jobs import tidemq's shared modules (states, table
    names, settings, input checks); ``tidemq/__init__`` exports the client lazily, so they do not
    load grpc, protobuf or kazoo through it. The client's names are still there on first use."""
    shared = "tidemq.lifecycle, tidemq.tables, tidemq.config, tidemq.validation, tidemq.clock, tidemq.trace"
    code = (f"import sys, {shared}\n"
            "loaded = sorted(m for m in ('grpc', 'google.protobuf', 'kazoo', 'tidemq.client') if m in sys.modules)\n"
            "import tidemq\n"
            "assert tidemq.Client.__module__ == 'tidemq.client' and tidemq.TidemqError.__module__ == 'tidemq.errors'\n"
            "assert set(tidemq.__all__) <= set(dir(tidemq))\n"
            "print(','.join(loaded))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
