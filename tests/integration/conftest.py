"""Fixtures shared by the integration tests of this folder."""

from __future__ import annotations

import pytest

from tidemq_broker.server import BrokerServer


@pytest.fixture
def two_brokers(settings):
    """Two brokers on the test's database and ZooKeeper chroot, stopped after the test."""
    brokers = [BrokerServer(settings).start() for _ in range(2)]
    yield brokers
    for broker in brokers:
        broker.stop(grace=1)
