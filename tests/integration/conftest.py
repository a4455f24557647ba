"""Fixtures shared by the integration tests of this folder."""

from __future__ import annotations

import threading

import pytest

from tidemq import Client, Settings
from tidemq_broker.server import BrokerServer


@pytest.fixture
def two_brokers(settings):
    """Two brokers on the test's database and ZooKeeper chroot, stopped after the test."""
    brokers = [BrokerServer(settings).start() for _ in range(2)]
    yield brokers
    for broker in brokers:
        broker.stop(grace=1)


@pytest.fixture
def clients(settings, two_brokers):
    """One client per broker of ``two_brokers``, each calling only its own."""
    made = [Client(Settings.from_env({}, brokers=broker.address, zk_hosts=settings.zk_hosts)) for broker in two_brokers]
    yield made
    for client in made:
        client.close()


def ack_at_once(*held) -> None:
    """Ack each (consumer, message) of ``held`` SUCCESS from a thread of its own, all released at
    the same instant (the last members of a fan-in finishing together on different brokers)."""
    start = threading.Barrier(len(held))

    def finish(consumer, message):
        start.wait()
        consumer.ack(succeeded=[message.id])

    threads = [threading.Thread(target=finish, args=pair) for pair in held]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
