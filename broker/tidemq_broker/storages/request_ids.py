"""Produce request ids: how the calls named in one insert are answered (pure rules, shared by
the SQL and the memory storage).

A Produce call carries a request id; a call whose id is stored already (committed before, here
or through another broker) stores nothing and gets the ids it was first answered. Stored answers
are "r<first>:<step>:<count>" (consecutive ids, written in the INSERT's own round trip) or a
comma-separated list of ids.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import MalformedRequestError, quote
from ..records import RequestRef

__all__ = ["Claims", "answer", "id_list", "stored_answer"]


class Claims:
    """How the requests of one insert are answered: from what is stored, by this insert, or as a
    repeat of another request of it (a retry that reached the same broker while its original
    still waited for a commit)."""

    def __init__(self) -> None:
        self.answered: dict[RequestRef, list[int]] = {}  # committed before: their stored ids
        self.ours: list[RequestRef] = []  # stored by this insert, with its ids
        self.repeats: list[tuple[RequestRef, RequestRef]] = []  # (repeat, first) within this insert

    @classmethod
    def of(cls, requests: Sequence[RequestRef], stored: dict[str, list[int]]) -> "Claims":
        claims = cls()
        first: dict[str, RequestRef] = {}
        for ref in requests:
            earlier = stored.get(ref.request_id)
            size = len(earlier) if earlier is not None else first[ref.request_id].count if ref.request_id in first \
                else ref.count
            if size != ref.count:
                raise MalformedRequestError(f"request_id {quote(ref.request_id)} was already used for a Produce "
                                            f"call of {size} messages, not {ref.count}")
            if earlier is not None:
                claims.answered[ref] = earlier
            elif ref.request_id in first:
                claims.repeats.append((ref, first[ref.request_id]))
            else:
                first[ref.request_id] = ref
                claims.ours.append(ref)
        return claims

    def skipped(self) -> set[int]:
        """Row indexes not to insert: answered before, or repeating another request here."""
        refs = list(self.answered) + [repeat for repeat, _ in self.repeats]
        return {i for ref in refs for i in range(ref.start, ref.start + ref.count)}


def answer(stored: str) -> list[int]:
    """Stored ids: "r<first>:<step>:<count>" (consecutive, written in the INSERT's round trip)
    or a comma-separated list."""
    if stored.startswith("r"):
        first, step, count = (int(part) for part in stored[1:].split(":"))
        return [first + k * step for k in range(count)]
    return [int(i) for i in stored.split(",")]


def id_list(ids: Sequence[int]) -> str:
    """The stored answer naming ``ids`` one by one."""
    return ",".join(str(i) for i in ids)


def stored_answer(request_id: str, stored: str, count: int) -> list[int]:
    """The ids a call of ``count`` messages whose ``request_id`` is stored gets back (a call of
    another size reusing it is refused, as ``Claims.of`` refuses it)."""
    ids = answer(stored)
    if len(ids) != count:
        raise MalformedRequestError(f"request_id {quote(request_id)} was already used for a Produce call of "
                                    f"{len(ids)} messages, not {count}")
    return ids
