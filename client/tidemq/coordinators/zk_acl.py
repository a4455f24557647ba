"""ZooKeeper ACLs for tidemq's nodes (TIDEMQ_ZK_AUTH): what they are and how old nodes get them."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, ANYONE_ID_UNSAFE, OPEN_ACL_UNSAFE, Permissions, make_acl, make_digest_acl

__all__ = ["hint", "node_acl", "secure_nodes"]

log = logging.getLogger(__name__)


def node_acl(auth: str) -> list[ACL]:
    """The ACL of every node tidemq creates: with ``auth`` (``user:password``), all rights for
    that digest identity and read for anyone; without, ZooKeeper's open ACL."""
    if not auth:
        return list(OPEN_ACL_UNSAFE)
    user, _, password = auth.partition(":")
    return [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]


def hint(exc: Exception) -> str:
    """What to fix when ZooKeeper refused a change for its ACL ('' for other errors)."""
    if isinstance(exc, NoAuthError):
        return (" (ZooKeeper's ACL refuses this session: set TIDEMQ_ZK_AUTH to the credentials "
                "tidemq's nodes were made with)")
    return ""


def _lacks(acl: list[ACL], ours: list[ACL]) -> bool:
    # Entries an operator added beside ours (a superuser, a monitoring identity) are kept;
    # a node that anyone may write, or that is not ours to administer, is not.
    writable = any(a.id == ANYONE_ID_UNSAFE and a.perms & ~Permissions.READ for a in acl)
    return writable or ours[0] not in acl


def secure_nodes(zk: KazooClient, paths: list[str], ours: list[ACL]) -> list[str]:
    """Set ``ours`` on each of ``paths`` that lacks it (nodes made before TIDEMQ_ZK_AUTH was
    set); return the paths changed. Ephemeral nodes of old sessions go with them, and old
    broadcasts are pruned in time, so they are not looked for."""
    changed = []
    for path in paths:
        try:
            acl, _ = zk.get_acls(path)
            if _lacks(acl, ours):
                zk.set_acls(path, ours)
                changed.append(path)
        except NoNodeError:
            continue  # an ephemeral child went with its session
    if changed:
        log.warning("set tidemq's ACL (all for the TIDEMQ_ZK_AUTH user, read for anyone) on %d ZooKeeper "
                    "nodes made without it: %s", len(changed), ", ".join(changed))
    return changed
