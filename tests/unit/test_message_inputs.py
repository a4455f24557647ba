"""A handler's ``message.inputs``, ``input`` and ``outcomes``: the results of the messages it
waited on, read once through the link it came from, in chunks, in ``depends_on`` order."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest

from tidemq import inputs
from tidemq.errors import InputError, RemoteError
from tidemq.lifecycle import MessageStatus as S
from tidemq.limits import MAX_RESULT_IDS
from tidemq.link import Delivery
from tidemq.queue_runner import delivery_to_message
from tidemq.results import MessageState, error_result


class Reader:
    """A link's ``results``: answers from ``states`` and records each call's ids."""

    def __init__(self, states: dict[int, MessageState]) -> None:
        self.states = states
        self.calls: list[list[int]] = []

    def results(self, ids, wait=0.0, timeout=None):
        self.calls.append(list(ids))
        # In the order asked, as the broker answers; an unknown id is not found.
        return [self.states.get(i, MessageState(i, False)) for i in ids]


def _done(msg_id, value):
    return MessageState(msg_id, True, S.SUCCESS, json.dumps(value) if value is not None else None)


def _delivery(depends_on=()):
    return Delivery(9, "t", "null", datetime.now(timezone.utc), 0, 1, "a" * 32, 30.0, depends_on=tuple(depends_on))


def test_inputs_are_the_results_in_depends_on_order_read_once():
    reader = Reader({1: _done(1, {"a": 1}), 4: _done(4, [2]), 7: _done(7, None)})
    message = delivery_to_message(_delivery([1, 4, 7]), reader)
    assert message.depends_on == (1, 4, 7)
    assert message.inputs == [{"a": 1}, [2], None]
    assert message.inputs == [{"a": 1}, [2], None]
    assert [o.id for o in message.outcomes] == [1, 4, 7] and all(o.succeeded for o in message.outcomes)
    assert reader.calls == [[1, 4, 7]]  # memoized: one read for every look


def test_input_is_the_one_dependencys_result_and_names_the_count_otherwise():
    reader = Reader({3: _done(3, 41)})
    assert delivery_to_message(_delivery([3]), reader).input == 41
    with pytest.raises(InputError, match="message 9 has 2 dependencies: use message.inputs"):
        delivery_to_message(_delivery([3, 5]), reader).input
    with pytest.raises(InputError, match="has 0 dependencies"):
        delivery_to_message(_delivery(), reader).input
    assert reader.calls == [[3]]  # a count other than one reads nothing


def test_a_message_without_dependencies_has_no_inputs_and_reads_nothing():
    reader = Reader({})
    message = delivery_to_message(_delivery(), reader)
    assert (message.depends_on, message.inputs, message.outcomes) == ((), [], [])
    assert reader.calls == []


def test_outcomes_show_failures_and_gone_dependencies_and_inputs_refuses_them():
    try:
        raise ValueError("bad row 7")
    except ValueError as exc:
        error = error_result(exc)
    reader = Reader({1: _done(1, 5), 2: MessageState(2, True, S.FAIL, error),
                     3: MessageState(3, True, S.CANCELLED, None)})
    message = delivery_to_message(_delivery([1, 2, 3, 4]), reader)
    ok, failed, cancelled, gone = message.outcomes
    assert (ok.status, ok.result, ok.error) == (S.SUCCESS, 5, None)
    assert failed.status is S.FAIL and failed.result is None
    assert isinstance(failed.error, RemoteError) and failed.error.type == "ValueError"
    assert failed.error.message == "bad row 7"
    assert (cancelled.status, cancelled.error) == (S.CANCELLED, None)
    assert (gone.status, gone.succeeded) == (None, False)
    with pytest.raises(InputError, match="dependency 2 of message 9 is FAIL"):
        message.inputs
    reader.states[2] = _done(2, 6)
    with pytest.raises(InputError, match="dependency 2"):  # kept: the first read decides
        message.inputs
    only_gone = delivery_to_message(_delivery([4]), reader)
    with pytest.raises(InputError, match="dependency 4 of message 9 is no longer stored"):
        only_gone.input


def test_many_dependencies_are_read_in_chunks_that_keep_a_reply_small(monkeypatch):
    ids = list(range(1, 1001))
    reader = Reader({i: _done(i, i * 2) for i in ids})
    assert inputs.results_chunk() == 16  # 1 MiB results: a quarter of a 64 MiB reply
    assert delivery_to_message(_delivery(ids), reader).inputs == [i * 2 for i in ids]
    assert [len(c) for c in reader.calls] == [16] * 62 + [8]
    assert [i for c in reader.calls for i in c] == ids
    monkeypatch.setenv("TIDEMQ_MAX_RESULT_BYTES", "1024")  # small results: the Results call's own limit
    assert inputs.results_chunk() == MAX_RESULT_IDS


def test_the_async_forms_read_through_an_asyncio_reader_or_a_thread():
    reader = Reader({1: _done(1, "x"), 2: _done(2, "y")})
    calls = []

    async def aresults(ids):
        calls.append(list(ids))
        return reader.results(ids)

    async def main():
        threaded = delivery_to_message(_delivery([1, 2]), reader)
        assert await threaded.ainputs() == ["x", "y"]
        looped = delivery_to_message(_delivery([1]))
        looped._aresults = aresults
        with pytest.raises(InputError, match="await message.ainputs"):
            looped.inputs
        assert await looped.ainput() == "x"
        assert looped.input == "x"  # kept once read
        with pytest.raises(InputError, match="has 2 dependencies"):
            await threaded.ainput()

    asyncio.run(main())
    assert reader.calls == [[1, 2], [1]] and calls == [[1]]
