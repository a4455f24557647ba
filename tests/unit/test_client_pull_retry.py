"""A pull that moves to another broker gives back its lease token first (the failed broker may
have leased messages under it before its reply was lost)."""

from __future__ import annotations

import pytest

from tidemq import Client, Settings
from tidemq.errors import BrokerUnavailableError
from tidemq.rpc import tidemq_pb2 as pb


class _TwoBrokers:
    """Stands in for the pool: the first broker fails, the second answers."""

    def __init__(self, events: list) -> None:
        self.events = events

    def call(self, method, request, timeout, on_attempt=None, track=None):
        for address in ("broker-a", "broker-b"):
            on_attempt(address)
            self.events.append(("pull", address))
        return pb.PullReply()


def _client(events: list, release_fails: bool = False) -> Client:
    client = Client(Settings(brokers=("broker-a", "broker-b")))
    client.pool = _TwoBrokers(events)

    def release(token, consumer="", timeout=None):
        events.append(("release", token, consumer))
        if release_fails:
            raise BrokerUnavailableError("no broker answered Release")
        return 0

    client.release = release
    return client


def test_a_retried_pull_releases_its_token_before_the_next_broker():
    events: list = []
    _client(events).pull("t", "worker-1", lease_token="ab" * 16)
    assert events == [("pull", "broker-a"), ("release", "ab" * 16, "worker-1"), ("pull", "broker-b")]


def test_without_a_token_or_when_the_release_fails_the_pull_goes_on():
    events: list = []
    _client(events).pull("t", "worker-1")
    assert events == [("pull", "broker-a"), ("pull", "broker-b")]
    events.clear()
    _client(events, release_fails=True).pull("t", "worker-1", lease_token="cd" * 16)
    assert events == [("pull", "broker-a"), ("release", "cd" * 16, "worker-1"), ("pull", "broker-b")]


class _TwoAsyncBrokers:
    def __init__(self, events: list) -> None:
        self.events = events

    async def acall(self, method, request, timeout, on_attempt=None):
        for address in ("broker-a", "broker-b"):
            await on_attempt(address)
            self.events.append(("pull", address))
        return pb.PullReply()


@pytest.mark.asyncio
async def test_the_async_pull_gives_back_its_token_before_the_next_broker_too():
    from tidemq.aio import AsyncClient

    events: list = []
    client = AsyncClient(Settings(brokers=("broker-a", "broker-b")))
    client.pool = _TwoAsyncBrokers(events)

    async def release(token, consumer="", timeout=None):
        events.append(("release", token, consumer))
        raise BrokerUnavailableError("no broker answered Release")  # the pull goes on regardless

    client.release = release
    await client.pull("t", "worker-1", lease_token="ef" * 16)
    assert events == [("pull", "broker-a"), ("release", "ef" * 16, "worker-1"), ("pull", "broker-b")]
