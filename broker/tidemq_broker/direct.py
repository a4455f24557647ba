"""The direct produce path: a Python producer commits its messages into the database itself.

With ``TIDEMQ_PRODUCE=direct`` a :class:`tidemq.Client` hands each Produce request it would
have sent to a broker to a :class:`DirectProducer` in its own process instead: the same checks
(``intake``), the same group commit (``writer``: concurrent ``produce()`` calls of the process
share one transaction), the same rows and trace lines, under the producer's name
(``direct:<host>:<pid>``). It saves the RPC: a lone ``produce()`` costs about what the INSERT
and its COMMIT cost.

Brokers learn of these rows as they do of ``tidemq.enqueue``'s: their insert watch reads what
was committed by others every probe interval while pulls wait (milliseconds). What the path
gives up is the broker's gate: tokens and topic grants are not checked, the database
credentials are the permission. It is for trusted Python processes that may write the
database; other languages, and producers that should hold a token rather than credentials,
keep the brokered path.

The client loads this module by name, so the client package never imports the broker's.
"""

from __future__ import annotations

import os
import socket
from typing import Optional

from tidemq import clock
from tidemq.config import Settings
from tidemq.errors import ConfigurationError
from tidemq.rpc import tidemq_pb2 as pb

from .intake import rows_from_request, steps_from_request
from .storage import Storage
from .storages import open_storage
from .topics import TopicCache
from .writer import GroupCommitWriter

__all__ = ["DirectProducer"]


class DirectProducer:
    """Commits Produce requests into the database at ``settings.db_url`` from this process."""

    def __init__(self, settings: Settings, storage: Optional[Storage] = None) -> None:
        if not settings.db_url:
            raise ConfigurationError("TIDEMQ_PRODUCE=direct needs the database: set TIDEMQ_DB_URL (or _FILE)")
        self._own_storage = storage is None
        self.storage = storage if storage is not None else open_storage(settings.db_url)
        self.name = f"direct:{socket.gethostname()}:{os.getpid()}"
        self.max_data_bytes = settings.max_data_bytes
        self.topics = TopicCache(self.storage.topics)
        # As many commits at once as the client keeps Produce RPCs open: its own coalescing
        # already queues what comes beyond them. No pull waits in this process: brokers' insert
        # watches find the rows, so a commit notifies no one.
        self.writer = GroupCommitWriter(self.storage.messages, self.topics, self.name, None,
                                        slots=settings.produce_in_flight)

    def produce(self, request: pb.ProduceRequest, timeout: float) -> list[int]:
        """Check and commit ``request``'s messages (all or none); their ids once committed.

        The request id is not stored: it lets a broker answer a client's retry on another broker,
        and nothing retries a direct commit (a connection lost during the COMMIT is reported as
        an outcome unknown, as for any INSERT of the application's own).
        """
        rows = rows_from_request(request, self.topics, self.max_data_bytes)
        steps = steps_from_request(request, rows)
        if steps is not None:  # their own transaction, as a broker's Produce gives them
            self.topics.ensure(sorted({step.row.topic for step in steps}))
            return self.storage.dependencies.insert_steps(steps, clock.now(), broker=self.name)
        return self.writer.write(rows, timeout)

    def close(self) -> None:
        """Refuse new requests and close the database connections this producer opened."""
        self.writer.stop()
        if self._own_storage:
            self.storage.close()
