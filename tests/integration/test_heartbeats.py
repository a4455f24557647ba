"""Automatic lease heartbeats across real processes: a handler that runs three times its ttr
keeps its lease while its worker lives, runs once, and no other worker ever gets its message."""

from __future__ import annotations

import math
import uuid

import pytest

from tests.integration.handlers_heartbeat import TOPIC, TTR
from tests.observe import all_messages, count, success_records
from tests.processes import process_env, start_broker_process, start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, trace
from tidemq.errors import MalformedRequestError
from tidemq.link import LeaseRef
from tidemq_broker.storages import open_storage

RUN_SECONDS = 3 * TTR


def test_a_handler_running_three_ttrs_keeps_its_lease_and_runs_exactly_once(settings, spawn, tmp_path):
    log = tmp_path / "runs.log"
    env = process_env(settings, HB_LOG=str(log), HB_RUN_SECONDS=str(RUN_SECONDS))
    start_broker_process(spawn, tmp_path, env)
    # Two workers, two handler threads each: a message whose lease expired would be leased again
    # (by whichever worker holds its shard) and run while the first run is still going.
    for name in ("w1", "w2"):
        start_worker(spawn, name, "tests.integration.handlers_heartbeat", env)
    client = Client(settings)
    storage = open_storage(settings.db_url)
    try:
        wait_registered(client.coordinator, TOPIC, 2)
        ids = client.produce_many(TOPIC, [{"n": n} for n in range(4)])

        def settled() -> bool:
            lost = [m.id for m in all_messages(storage, TOPIC) if "LEASE_EXPIRED" in m.trace]
            assert not lost, f"leases expired while their handlers ran: {lost}"  # fail now, not at the timeout
            return count(storage, TOPIC, "SUCCESS") == len(ids)

        wait_until(settled, 60, 0.2, "every message to succeed")
        runs = [line.split() for line in log.read_text().splitlines()]
        assert sorted(int(r[0]) for r in runs) == sorted(ids), "a message ran more than once (or never)"
        assert {r[2] for r in runs} == {"1"}
        assert all(float(r[4]) - float(r[3]) >= RUN_SECONDS - 0.1 for r in runs)
        assert len({r[1] for r in runs}) == 2, "both workers were running handlers"
        messages = all_messages(storage, TOPIC)
        assert sorted(m.id for m in messages) == sorted(ids)
        for message in messages:
            events = [entry["event"] for entry in trace.parse(message.trace)]
            assert "LEASE_EXPIRED" not in events, message.trace
            assert events.count("LOCKED") == 1, f"delivered more than once: {message.trace}"
            assert success_records(message) == 1 and message.attempt == 1
    finally:
        client.close()
        storage.close()


def test_extend_moves_every_lease_still_held_in_one_call(client, broker):
    ids = client.produce_many("hb.extend", [{}, {}])
    token = uuid.uuid4().hex
    got = client.pull("hb.extend", "c", max_messages=2, wait=5, ttr=5, lease_token=token)
    assert sorted(d.id for d in got) == ids
    before = broker.storage.reads.get_message(ids[0]).lease_expire
    extended = client.extend([LeaseRef(ids[0], token), LeaseRef(ids[1], uuid.uuid4().hex)], 600, "c")
    assert extended == [True, False]  # the second names a token it was not leased under
    assert (broker.storage.reads.get_message(ids[0]).lease_expire - before).total_seconds() > 500
    assert broker.storage.reads.get_message(ids[1]).lease_expire < broker.storage.reads.get_message(ids[0]).lease_expire


@pytest.mark.parametrize("leases, ttr, words", [
    ([LeaseRef(-3, "ab" * 16)], 5, "positive message ids"),
    ([LeaseRef(1, "not-a-token")], 5, "32 lowercase hex"),
    ([LeaseRef(1, "ab" * 16)], 0, "ttr_seconds must be between 1 and"),
    ([LeaseRef(1, "ab" * 16)], math.nan, "ttr_seconds must be between 1 and"),
    ([LeaseRef(1, "ab" * 16)], math.inf, "ttr_seconds must be between 1 and"),
])
def test_a_malformed_extend_is_refused_naming_the_limit(client, leases, ttr, words):
    with pytest.raises(MalformedRequestError) as info:
        client.extend(leases, ttr)
    assert words in str(info.value)
