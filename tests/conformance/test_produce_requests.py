"""Produce request ids, on every storage implementation (memory, SQLite, MariaDB, Galera): a retried
call is answered from what is stored and stores nothing, even when it races its original."""

from __future__ import annotations

import threading

import pytest

from tests.conformance.storage_ops import rows
from tidemq import clock
from tidemq_broker.storage import RequestRef


@pytest.fixture
def storage(any_storage):
    return any_storage


def test_a_retried_produce_request_gets_its_first_answer_and_stores_nothing(storage):
    now = clock.now()
    first = storage.messages.insert_messages(rows("t.req", 3) + rows("t.req", 2), now,
                                    [RequestRef("call-a", 0, 3), RequestRef("call-b", 3, 2)])
    # A batch mixing a retry of call-b, a new call, a repeat of that new call and plain rows.
    again = storage.messages.insert_messages(rows("t.req", 2) + rows("t.req", 1) + rows("t.req", 1) + rows("t.req", 1),
                                             now, [RequestRef("call-b", 0, 2), RequestRef("call-c", 2, 1),
                                                   RequestRef("call-c", 3, 1)])
    assert again[:2] == first[3:]  # the retry: the ids it was first answered
    assert again[2] == again[3] and again[2] not in first  # one row for call-c, both occurrences
    assert again[4] not in first + again[:4]  # rows without a request id are always stored
    assert storage.counts.count_by_status("t.req") == {"t.req": {"NEW": 7}}
    with pytest.raises(ValueError, match="already used for a Produce call of 3 messages, not 1"):
        storage.messages.insert_messages(rows("t.req", 1), now, [RequestRef("call-a", 0, 1)])
    assert storage.counts.count_by_status("t.req") == {"t.req": {"NEW": 7}}


def test_the_same_request_through_two_brokers_at_once_is_stored_once(storage):
    now = clock.now()
    results, errors = [], []

    def call():
        try:
            results.append(storage.messages.insert_messages(rows("t.req.race", 4), now, [RequestRef("racing", 0, 4)]))
        except Exception as exc:  # noqa: BLE001 - the test reports it below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(results) == 4
    assert all(r == results[0] for r in results)
    assert storage.counts.count_by_status("t.req.race") == {"t.req.race": {"NEW": 4}}
