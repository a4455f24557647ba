"""Producing and taking back: unique keys, cancel, and input refused before anything is stored.
Each scenario runs against the StubBroker and a real broker."""

from __future__ import annotations

import pytest

from tidemq.errors import InvalidDelayError, InvalidRetryError, InvalidTopicError, MalformedRequestError

from .scenario import ack, pull


def test_a_repeated_unique_key_returns_the_stored_message(double):
    first = double.link.produce("t", {"v": 1}, unique_key="order-42")
    assert double.link.produce("t", {"v": 2}, unique_key="order-42") == first
    assert double.link.produce("other", {"v": 3}, unique_key="order-42") != first  # keys are per topic
    [d] = pull(double, "t")
    assert d.id == first and d.data == '{"v":1}'


def test_only_a_message_nobody_started_can_be_cancelled(double):
    pending = double.link.produce("t", 1, delay=60)
    running, done = double.link.produce_many("t", [2, 3])
    held = {d.id: d for d in pull(double, "t")}
    assert set(held) == {running, done}
    ack(double, "t", [held[done]])
    assert double.link.cancel_many([running, done, 10_000]) == [False, False, False]
    assert (double.stored(running).status, double.stored(done).status) == ("RUNNING", "SUCCESS")
    assert double.link.cancel(pending) is True and double.stored(pending) is None
    assert double.link.cancel(pending) is False


@pytest.mark.parametrize("call, error, text", [
    (lambda link: link.produce("bad topic", 1), InvalidTopicError, "characters outside"),
    (lambda link: link.produce("t", 1, delay=-1), InvalidDelayError, "delay must be between 0"),
    (lambda link: link.produce("t", 1, retry=[0, "soon"]), InvalidRetryError, "is not of the form"),
    (lambda link: link.produce("t", 1, priority=10), MalformedRequestError, "priority must be a whole number"),
    (lambda link: link.pull("t", "c", rank=2, total=2, wait=0), MalformedRequestError, "rank must be in"),
    (lambda link: link.pull("t", "c", lease_token="X" * 32, wait=0), MalformedRequestError, "32 lowercase hex"),
], ids=["topic", "delay", "retry", "priority", "rank", "lease_token"])
def test_bad_input_is_refused_naming_the_limit_and_nothing_is_stored(double, call, error, text):
    with pytest.raises(error, match=text):
        call(double.link)
    assert double.link.produce("t", "ok") == 1  # the refused call stored nothing
