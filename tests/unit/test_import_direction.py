"""Imports flow one way: cli -> admin_web -> broker -> client; the pipeline stands apart."""

from __future__ import annotations

import ast
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
