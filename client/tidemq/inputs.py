"""A step's inputs: the results of the messages it waited on, read when its handler asks.

A delivery names the messages its message waited on (``Delivery.depends_on``, ascending ids:
within one submission the order the steps were declared in), never their results: a result may
be 1 MiB and a step may wait on 1,000. The handler's first look at ``message.inputs``,
``message.input`` or ``message.outcomes`` reads them with ``Results`` calls of the link the
message came from (the cluster, or the StubBroker), in chunks of :func:`results_chunk` ids so
that each reply stays well under the gRPC message limit, and keeps them for later looks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Sequence

from .config import MAX_REQUEST_BYTES
from .errors import InputError, RemoteError
from .lifecycle import MessageStatus
from .limits import MAX_RESULT_IDS
from .results import MessageState, max_result_bytes, remote_error

__all__ = ["Outcome", "ReadResults", "AsyncReadResults", "results_chunk", "read_outcomes", "aread_outcomes",
           "inputs_of", "single_input"]

#: Reads the states of up to :func:`results_chunk` ids (a link's ``results``).
ReadResults = Callable[[Sequence[int]], list[MessageState]]
#: The same for asyncio (``AsyncClient.results``).
AsyncReadResults = Callable[[Sequence[int]], Awaitable[list[MessageState]]]
#: The share of a reply's limit the results of one chunk may fill, at most.
_REPLY_SHARE = 4


@dataclass(frozen=True)
class Outcome:
    """How one dependency ended: its ``status`` (None: no longer stored), its ``result`` (the
    decoded return value on SUCCESS, else None) and its ``error`` (a :class:`RemoteError` after a
    FAIL, or the error a CANCELLED message stored, else None)."""

    id: int
    status: Optional[MessageStatus]
    result: Any = None
    error: Optional[RemoteError] = None

    @property
    def succeeded(self) -> bool:
        """True when the dependency ended SUCCESS."""
        return self.status is MessageStatus.SUCCESS


def results_chunk() -> int:
    """Ids per Results call: as many largest results as fill a quarter of a reply's limit
    (16 at the default 1 MiB limit of a result), at most ``MAX_RESULT_IDS``."""
    return max(1, min(MAX_RESULT_IDS, MAX_REQUEST_BYTES // _REPLY_SHARE // max_result_bytes()))


def _outcome(state: MessageState) -> Outcome:
    if not state.found:
        return Outcome(state.id, None)
    if state.status is MessageStatus.SUCCESS:
        return Outcome(state.id, state.status, json.loads(state.result) if state.result else None)
    failed = state.status in (MessageStatus.FAIL, MessageStatus.CANCELLED) and state.result
    return Outcome(state.id, state.status, None, remote_error(state.result) if failed else None)


def _chunks(ids: Sequence[int], chunk: Optional[int]) -> list[list[int]]:
    size = chunk or results_chunk()
    return [list(ids[start : start + size]) for start in range(0, len(ids), size)]


def _outcomes(part: Sequence[int], states: Sequence[MessageState]) -> list[Outcome]:
    by_id = {state.id: state for state in states}
    return [_outcome(by_id.get(id, MessageState(id, False))) for id in part]


def read_outcomes(read: ReadResults, ids: Sequence[int], chunk: Optional[int] = None) -> list[Outcome]:
    """The outcome of each of ``ids``, in order, read ``chunk`` ids per call."""
    return [outcome for part in _chunks(ids, chunk) for outcome in _outcomes(part, read(part))]


async def aread_outcomes(read: AsyncReadResults, ids: Sequence[int], chunk: Optional[int] = None) -> list[Outcome]:
    """:func:`read_outcomes` with an asyncio reader."""
    found: list[Outcome] = []
    for part in _chunks(ids, chunk):
        found.extend(_outcomes(part, await read(part)))
    return found


def inputs_of(msg_id: int, outcomes: Sequence[Outcome]) -> list[Any]:
    """The results of ``outcomes``, in order; an :class:`InputError` names the first dependency
    that did not succeed (or is gone)."""
    for outcome in outcomes:
        if not outcome.succeeded:
            state = "is no longer stored" if outcome.status is None else f"is {outcome.status.value}"
            raise InputError(f"dependency {outcome.id} of message {msg_id} {state}, so it has no result to "
                             "hand on: message.outcomes shows how each dependency ended")
    return [outcome.result for outcome in outcomes]


def single_input(msg_id: int, outcomes: Sequence[Outcome]) -> Any:
    """The one input of a message with exactly one dependency."""
    if len(outcomes) != 1:
        raise InputError(f"message.input is the result of the one dependency of a message; message {msg_id} "
                         f"has {len(outcomes)} dependencies: use message.inputs (a list, in their order)")
    return inputs_of(msg_id, outcomes)[0]
