"""``TIDEMQ_PRODUCE=direct``: where a client finds the producer that commits in its own process.

The producer itself (checks, group commit, SQL) belongs to the broker package
(``tidemq_broker.direct``); it is loaded here by name, once, when a client is made with the
setting, as ``tidemq.transactional`` forwards ``tidemq.enqueue``: the client package never
imports the broker's, and a process that does not ask for the direct path never loads it. A
producer that commits directly installs ``tidemq[broker]`` (SQLAlchemy and the database driver).
"""

from __future__ import annotations

import importlib
from typing import Protocol

from .config import Settings
from .errors import ConfigurationError
from .rpc import tidemq_pb2 as pb

__all__ = ["DirectPath", "open_direct", "produce_flushes"]

_MODULE = "tidemq_broker.direct"


class DirectPath(Protocol):
    """What a client needs of the direct producer: a Produce request in, the ids out."""

    def produce(self, request: pb.ProduceRequest, timeout: float) -> list[int]:
        """Check and commit ``request``'s messages (all or none); return their ids."""

    def close(self) -> None:
        """Stop taking requests and close the producer's database connections."""


def open_direct(settings: Settings) -> DirectPath:
    """The direct producer for ``settings`` (its database at ``settings.db_url``)."""
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as exc:
        raise ConfigurationError(
            "TIDEMQ_PRODUCE=direct commits through tidemq's broker package: install tidemq[broker] "
            f"({exc})"
        ) from None
    return module.DirectProducer(settings)  # type: ignore[no-any-return]


def produce_flushes(settings: Settings) -> int:
    """How many produce flushes a client (sync or asyncio) keeps running at once.

    Through brokers: ``produce_in_flight`` RPCs. A direct producer commits ``produce_in_flight``
    groups at once (its own group commit); as many flushes again may check their rows and queue
    meanwhile, so the next group is ready when a commit ends (4 threads: 3,100 -> 3,500 msg/s).
    Without a bound every caller would check its own row while 64 compete for the GIL (10,200 ->
    8,300 msg/s)."""
    return settings.produce_in_flight * (2 if settings.produce_path == "direct" else 1)
