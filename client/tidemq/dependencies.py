"""The lifecycle of a message with dependencies: its start as WAITING, its release, its stop.

A message produced with dependencies that have not all succeeded is WAITING (see
``tidemq.lifecycle.MessageStatus``) and counts them in ``deps_left``. Each SUCCESS of a
dependency lowers the count in the transaction that records the SUCCESS; the one that brings it
to 0 moves the message to NEW with :func:`released`. Under the failure policy ``stop`` (the only
one so far) a dependency that ends FAIL or CANCELLED cancels its waiting dependents with
:func:`dependency_failed`, and theirs in turn::

    (produce with dependencies) --> WAITING --released (last dependency succeeded)--> NEW
                                    WAITING --dependency_failed (policy stop)--> CANCELLED
                                    WAITING --cancel--> gone

Like every transition of ``tidemq.lifecycle``, each function returns a ``Change`` that the
storages apply as it is.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Optional

from . import trace
from .errors import DependencyError
from .lifecycle import CANCELLED, FAIL, NEW, SUCCESS, WAITING, Change, Event, MessageStatus, produce
from .tables import MESSAGE as M

__all__ = ["FailurePolicy", "waiting", "released", "dependency_failed", "edited"]


class FailurePolicy(str, enum.Enum):
    """What a dependency that ends FAIL or CANCELLED does to the steps waiting on it.

    STOP: they are CANCELLED, and the steps waiting on them in turn. (CONTINUE, which runs a
    workflow's callback with the failures, needs the workflow's own row and comes later.)
    """

    STOP = "stop"


def waiting(now: datetime, deps_left: int, **who: object) -> Change:
    """A new message with ``deps_left`` dependencies not succeeded yet: WAITING (NEW when 0)."""
    base = produce(now, **who)
    target = WAITING if deps_left > 0 else NEW
    values = {**base.values, M.status: target.value, M.deps_left: max(deps_left, 0)}
    return Change(base.event, (), target, values, trace=base.trace)


def released(now: datetime, effect_time: datetime, parent_id: int, broker: str) -> Change:
    """WAITING -> NEW: its last dependency, ``parent_id``, succeeded. Due at its own effect_time
    or now, whichever is later: a step produced with a delay keeps it, and one whose time passed
    while it waited is due now, not at a time below the floor the brokers' lock hints read from
    (``tidemq_broker.hints``: no NEW message is due before it), where no lock would look."""
    values = {M.effect_time: max(effect_time, now), M.update_time: now}
    return Change(Event.DEPENDENCY_MET, (WAITING,), NEW, values,
                  trace=trace.line(now, Event.DEPENDENCY_MET.value, dependency=parent_id, broker=broker))


def dependency_failed(now: datetime, parent_id: int, parent_status: str, broker: Optional[str] = None) -> Change:
    """WAITING -> CANCELLED under the policy stop: dependency ``parent_id`` ended
    ``parent_status`` (FAIL or CANCELLED), so this step will never run."""
    values = {M.finish_time: now, M.update_time: now}
    return Change(Event.DEPENDENCY_FAILED, (WAITING,), CANCELLED, values,
                  trace=trace.line(now, Event.DEPENDENCY_FAILED.value, dependency=parent_id,
                                   dependency_status=parent_status, broker=broker))


def edited(msg_id: int, before: str, after: Optional[str], has_dependents: bool) -> Optional[MessageStatus]:
    """What an operator's edit of message ``msg_id`` from status ``before`` to ``after`` (None:
    unchanged) means to the messages waiting on it: SUCCESS releases them as an ack's would,
    FAIL or CANCELLED stops them; None, nothing.

    A message others depend on keeps its status once it succeeded: its SUCCESS already lowered its
    dependents' counts, and a second SUCCESS (an edit back to SUCCESS, or a run after an edit to
    NEW) would lower them again and release a step whose other dependencies have not succeeded.
    """
    if after is None or after == before or not has_dependents:
        return None
    if before == SUCCESS.value:
        raise DependencyError(f"message {msg_id} succeeded and others depend on it: they were "
                              f"released by that SUCCESS, so its status cannot be changed by hand")
    status = MessageStatus(after)
    return status if status in (SUCCESS, FAIL, CANCELLED) else None
