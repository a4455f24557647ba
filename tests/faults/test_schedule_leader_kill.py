"""A per-second schedule while the maintenance leader is killed with -9: the other broker takes
over, and every tick of the whole window is stored exactly once (a gap only where the outage was
longer than the 'once' policy's catch-up window)."""

from __future__ import annotations

from datetime import timedelta

from tests.observe import all_messages
from tests.processes import kill9, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, clock, trace
from tidemq_broker.schedules import MISSED_AFTER, unique_key
from tidemq_broker.storages import open_storage

TOPIC = "sched.tick"


def test_one_message_per_tick_over_a_leader_kill(settings, spawn, tmp_path, record_property):
    # A short session: the dead leader's election node goes within seconds, well inside the
    # catch-up window, so no tick may be missing either.
    env = process_env(settings, TIDEMQ_ZK_SESSION_TIMEOUT="4")
    brokers = dict(start_broker_process(spawn, tmp_path, env, f"broker{i}")[::-1] for i in range(2))
    client = Client(settings)
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: set(client.pool.addresses()) == set(brokers), 30, what="both brokers discovered")
        assert client.schedule("every-second", TOPIC, "* * * * * *", {"job": "tick"}) is True
        assert client.schedule("every-second", TOPIC, "* * * * * *", {"job": "tick"}) is False  # idempotent
        leader = wait_until(lambda: client.coordinator.leader() in brokers and client.coordinator.leader(), 30,
                            what="a maintenance leader")
        wait_until(lambda: len(all_messages(storage, TOPIC)) >= 5, 30, 0.25, what="five ticks before the kill")
        killed_at = clock.from_epoch_ms(int(kill9(brokers[leader]) * 1000))
        survivor = next(address for address in brokers if address != leader)
        wait_until(lambda: client.coordinator.leader() == survivor, 30, what="the other broker to lead")
        wait_until(lambda: any(m.effect_time > killed_at + timedelta(seconds=8) for m in all_messages(storage, TOPIC)),
                   40, 0.25, what="ticks 8 s after the kill")
        messages = sorted(all_messages(storage, TOPIC), key=lambda m: m.effect_time)
    finally:
        client.close()
        storage.close()

    ticks = [m.effect_time for m in messages]
    assert len(ticks) == len(set(ticks)), "a tick was stored twice"
    assert all(t.microsecond == 0 for t in ticks)
    assert all(m.unique_key == unique_key("every-second", m.effect_time) and m.data == '{"job":"tick"}'
               for m in messages)
    producers = [trace.parse(m.trace)[0].get("broker") for m in messages]
    before, after = ([m for m, p in zip(messages, producers) if p == who] for who in (leader, survivor))
    assert before and after and len(before) + len(after) == len(messages), "only the leaders produce"
    assert max(m.add_time for m in before) <= killed_at < min(m.add_time for m in after)
    gaps = [(a, b) for a, b in zip(messages, messages[1:]) if b.effect_time - a.effect_time != timedelta(seconds=1)]
    # The survivor catches up every tick younger than MISSED_AFTER; an outage that long leaves one gap.
    for a, b in gaps:
        assert b.add_time - a.effect_time > timedelta(seconds=MISSED_AFTER), f"tick missing after {a.effect_time}"
    assert len(gaps) <= 1
    late = max((m.add_time - m.effect_time).total_seconds() for m in after)
    assert late > 1.0, "the failover should have left ticks for the new leader to catch up"
    figures = (f"ticks {len(ticks)}, by the killed leader {len(before)}, by its successor {len(after)}, "
               f"gaps {len(gaps)}, latest catch-up {late:.1f} s")
    record_property("figures", figures)
    print(f"\n{figures}")
