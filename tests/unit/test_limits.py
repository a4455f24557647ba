"""The limits and the lease token's form are written once, in tidemq.limits, and used from there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tidemq import limits
from tidemq.errors import MalformedRequestError

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_lease_token_has_the_form_every_check_accepts():
    tokens = {limits.new_lease_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(limits.check_lease_token(token) == token for token in tokens)


@pytest.mark.parametrize("bad", ["", "A" * 32, "a" * 31, "a" * 33, "g" * 32, " " + "a" * 31, None, 42])
def test_a_malformed_lease_token_is_refused_naming_the_form(bad):
    with pytest.raises(MalformedRequestError, match="32 lowercase hex characters"):
        limits.check_lease_token(bad)


def test_no_other_module_defines_a_limit_or_a_lease_token_of_its_own():
    """Each name of tidemq.limits is assigned (or defined) there alone; the client, the stub
    broker, the broker and the console import it."""
    names = set(limits.__all__)
    found = []
    for folder in ("client", "broker", "admin_web", "cli", "pipeline"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(limits.__file__).resolve():
                continue
            for node in ast.parse(path.read_text(), str(path)).body:  # module level
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple)
                                                                     else [target])]
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    targets = [node.target]
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                    found.append(f"{path.relative_to(ROOT)} defines {node.name}")
                found += [f"{path.relative_to(ROOT)} assigns {t.id}" for t in targets
                          if isinstance(t, ast.Name) and t.id in names]
    assert not found, "\n".join(found)


def test_the_broker_checks_pulls_with_the_same_bounds():
    from tidemq_broker import intake

    assert (intake.MAX_TTR, intake.MAX_AHEAD, intake.MAX_PULL, intake.MAX_WAIT) == \
        (limits.MAX_TTR, limits.MAX_AHEAD, limits.MAX_PULL, limits.MAX_WAIT)
    assert intake.check_lease_token is limits.check_lease_token
