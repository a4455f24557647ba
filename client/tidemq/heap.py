"""The cycle collector of tidemq's long-running processes: ``tidemq broker`` and ``tidemq worker``.

CPython's cycle collector makes a full collection (of the oldest generation) whenever the
objects promoted into it since the last one reach a quarter of those it held then. A broker or
a worker holds 75,000 to 115,000 tracked objects once it has started (grpc, protobuf,
SQLAlchemy, kazoo and the application's modules), nearly all alive for the whole process. At
thousands of messages a second the objects of each message in flight (deliveries leased ahead,
leases, requests waiting for a group commit) are often alive when a young collection runs, so
they are promoted: the pressure benchmark's workers made a full collection every 2.5-4 s at
full speed and about every 40 s at half of it. Each walked every one of those objects with the
GIL held: 15 ms on an idle core, 65-145 ms measured in those workers on two busy cores, so
every handler start, due timer, heartbeat and reply of the process waited that long.

:func:`settle` runs once the process has started: a collection frees what start-up left, then
``gc.freeze()`` moves every object still alive into the permanent generation, which
collections no longer walk. What start-up built stays for the process's life anyway. Objects
made afterwards are collected as before, so a full collection costs what the messages in
flight and the caches filled since cost, not what the imports did (a few milliseconds at most
in the same workers: 2.6-5.2 ms the longest of a pressure run's clean phase to its end). The
thresholds stay Python's: a larger youngest generation made each young collection of a busy
broker longer (5-20 ms) for no fewer full ones.

``TIDEMQ_GC=python`` (``Settings.gc``) leaves Python's collector as it was.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["settle", "GC_MODES"]

log = logging.getLogger(__name__)

#: The values of ``TIDEMQ_GC``: "settled" (the default for tidemq's processes) or "python".
GC_MODES = ("settled", "python")


def settle(mode: str = "settled") -> bool:
    """Freeze what the process built while starting (see the module's docstring); return whether
    it did. Call it once, from the process's own command, after start-up: objects alive then are
    never collected afterwards."""
    if mode != "settled" or not gc.isenabled():
        return False  # an application that turned the collector off keeps it off
    gc.collect()
    gc.freeze()
    log.debug("cycle collector settled: %d objects frozen", gc.get_freeze_count())
    return True
