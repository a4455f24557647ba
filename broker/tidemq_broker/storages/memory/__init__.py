"""The memory storage: the whole storage interface on dicts in one process, for unit tests of
the broker (``BrokerService``, the group commit, the pull hub) and embedded use.

It passes the conformance suite every SQL storage passes (tests/conformance), and keeps the
semantics that come from SQL rather than from tidemq: ids handed out by an auto-increment column
(with a server's id step, so the QUEUE shard rule divides by it), unique keys, produce request
ids answered from what is stored, NOT NULL columns refused whole, the lock hints (a lock reads
only from the floor and only the priorities named), stranded shards, flow limits with the rate's
bucket in the topic row, and the console's bounded scans. Every transition is a
``tidemq.lifecycle`` Change applied through ``Change.allows`` / ``Change.apply_to``.

What it does not have: durability (a process that ends loses everything), other processes
(another broker cannot share it, and ``tidemq.enqueue`` writes in an application's SQL
transaction, which this is not), and the pipeline's tables (stats and alarms read empty).
Each operation holds one lock for its whole length, like a serializable transaction, so
nothing is ever skipped as locked by someone else.
"""

from __future__ import annotations

from ...errors import ConfigurationError
from ...schema import SCHEMA_VERSION
from ...storage import Storage
from .accounts import MemoryPrincipals, MemorySessions
from .console import MemoryConsole
from .dependencies import MemoryDependencies
from .leases import MemoryAcks, MemoryLeases
from .probes import MemoryProbes
from .schedules import MemorySchedules
from .state import ConstraintError, MemoryState
from .topics import MemoryCounts, MemoryReads, MemoryTopics
from .writes import MemoryWrites

__all__ = ["open_memory_storage", "MemorySchema", "ConstraintError"]


class MemorySchema:
    """The schema of a memory storage is always the current one; the database always answers."""

    def create_schema(self) -> None:
        pass

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def migrate(self, version: int) -> None:
        if not 1 < version <= SCHEMA_VERSION:
            raise ConfigurationError(f"no schema step leads to version {version}")

    def ping(self) -> None:
        pass


def open_memory_storage(id_step: int = 1) -> Storage:
    """A new, empty memory storage. ``id_step``: how far apart its ids are, as a server's
    ``auto_increment_increment`` (a Galera cluster of n nodes sets n)."""
    state = MemoryState(id_step)
    return Storage(schema=MemorySchema(), messages=MemoryWrites(state), dependencies=MemoryDependencies(state),
                   leases=MemoryLeases(state),
                   acks=MemoryAcks(state), probes=MemoryProbes(state), topics=MemoryTopics(state),
                   reads=MemoryReads(state), counts=MemoryCounts(state), schedules=MemorySchedules(state),
                   principals=MemoryPrincipals(state), sessions=MemorySessions(state), console=MemoryConsole(state))
