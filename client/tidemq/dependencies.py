"""The lifecycle of a message with dependencies: its start as WAITING, its release, its stop.

A message produced with dependencies that have not all succeeded is WAITING (see
``tidemq.lifecycle.MessageStatus``) and counts them in ``deps_left``. Each SUCCESS of a
dependency lowers the count in the transaction that records the SUCCESS; the one that brings it
to 0 moves the message to NEW with :func:`released`. What a dependency that ends FAIL or
CANCELLED does depends on the waiting message's :class:`WaitMode`: after success (the failure
policy ``stop``) it cancels the message with :func:`dependency_failed`, and the messages waiting
on that one in turn; after complete or after failure (the policy ``continue``, batches'
callbacks) it counts as ended (``deps_failed`` goes up with ``deps_left`` down), and a message
waiting for a failure whose dependencies all succeeded is cancelled by :func:`not_needed`::

    (produce with dependencies) --> WAITING --released (last dependency ended as it waits for)--> NEW
                                    WAITING --dependency_failed (after success)--> CANCELLED
                                    WAITING --not_needed (after failure, none failed)--> CANCELLED
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
from .lifecycle import RUNNING as _RUNNING
from .tables import MESSAGE as M

__all__ = ["FailurePolicy", "WaitMode", "WorkflowState", "waiting", "released", "dependency_failed", "not_needed",
           "check_wait_mode", "edited"]


class FailurePolicy(str, enum.Enum):
    """What a dependency that ends FAIL or CANCELLED does to the steps of a workflow waiting on it.

    STOP: they are CANCELLED, and the steps waiting on them in turn (each step waits
    ``AFTER_SUCCESS``). CONTINUE: it counts as ended and they run once all their dependencies
    ended, whatever the outcome (each step waits ``AFTER_COMPLETE``).
    """

    STOP = "stop"
    CONTINUE = "continue"


class WaitMode(enum.IntEnum):
    """How one message waits on its dependencies (``tidemq_message.wait_mode``).

    AFTER_SUCCESS (0): released once they all succeeded; one that fails cancels it (policy stop).
    AFTER_COMPLETE (1): released once they all ended, whatever their outcome (policy continue, a
    batch's ``on_complete``). AFTER_FAILURE (2): released once they all ended with at least one
    FAIL or CANCELLED among them; cancelled (:func:`not_needed`) if they all succeeded (a batch's
    ``on_failure``).
    """

    AFTER_SUCCESS = 0
    AFTER_COMPLETE = 1
    AFTER_FAILURE = 2


class WorkflowState(str, enum.Enum):
    """A workflow's state (``tidemq_workflow.state``): RUNNING until its last step ended, then
    SUCCEEDED (every step succeeded), FAILED (a step ended FAIL or CANCELLED) or CANCELLED (it
    was cancelled as a whole)."""

    RUNNING = _RUNNING.value  # the word a message's status uses
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


def check_wait_mode(value: int) -> WaitMode:
    """``value`` as a :class:`WaitMode`; a ValueError names the ones there are."""
    try:
        return WaitMode(value)
    except ValueError:
        known = ", ".join(f"{mode.value} ({mode.name.lower()})" for mode in WaitMode)
        raise ValueError(f"wait_mode must be one of {known}, got {value}") from None


def waiting(now: datetime, deps_left: int, wait_mode: int = WaitMode.AFTER_SUCCESS, deps_failed: int = 0,
            **who: object) -> Change:
    """A new message with ``deps_left`` dependencies not ended yet (``deps_failed`` others ended
    without succeeding): WAITING (NEW when 0), waiting as ``wait_mode`` says."""
    base = produce(now, **who)
    target = WAITING if deps_left > 0 else NEW
    values = {**base.values, M.status: target.value, M.deps_left: max(deps_left, 0), M.wait_mode: int(wait_mode),
              M.deps_failed: deps_failed}
    return Change(base.event, (), target, values, trace=base.trace)


def released(now: datetime, effect_time: datetime, parent_id: int, broker: str) -> Change:
    """WAITING -> NEW: its last dependency, ``parent_id``, ended as the message waits for (succeeded,
    or any outcome after complete or after failure). Due at its own effect_time
    or now, whichever is later: a step produced with a delay keeps it, and one whose time passed
    while it waited is due now, not at a time below the floor the brokers' lock hints read from
    (``tidemq_broker.hints``: no NEW message is due before it), where no lock would look."""
    values = {M.effect_time: max(effect_time, now), M.update_time: now, M.deps_left: 0}
    return Change(Event.DEPENDENCY_MET, (WAITING,), NEW, values,
                  trace=trace.line(now, Event.DEPENDENCY_MET.value, dependency=parent_id, broker=broker))


def dependency_failed(now: datetime, parent_id: int, parent_status: str, broker: Optional[str] = None) -> Change:
    """WAITING -> CANCELLED for a message waiting after success (policy stop): dependency
    ``parent_id`` ended ``parent_status`` (FAIL or CANCELLED), so this step will never run."""
    values = {M.finish_time: now, M.update_time: now}
    return Change(Event.DEPENDENCY_FAILED, (WAITING,), CANCELLED, values,
                  trace=trace.line(now, Event.DEPENDENCY_FAILED.value, dependency=parent_id,
                                   dependency_status=parent_status, broker=broker))


def not_needed(now: datetime, parent_id: int, broker: Optional[str] = None) -> Change:
    """WAITING -> CANCELLED for a message waiting after failure: its dependencies all succeeded
    (``parent_id`` last), so there is no failure for it to handle."""
    values = {M.finish_time: now, M.update_time: now}
    return Change(Event.DEPENDENCIES_SUCCEEDED, (WAITING,), CANCELLED, values,
                  trace=trace.line(now, Event.DEPENDENCIES_SUCCEEDED.value, dependency=parent_id, broker=broker))


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
