"""A pull that moves to another broker gives back its lease token first (the failed broker may
have leased messages under it before its reply was lost)."""

from __future__ import annotations

import threading

import pytest

from tidemq import Client, Settings
from tidemq.errors import BrokerUnavailableError, PullCancelledError, TidemqError
from tidemq.link import PullHandle
from tidemq.pool import BrokerPool
from tidemq.rpc import tidemq_pb2 as pb


class _TwoBrokers:
    """Stands in for the pool: the first broker fails the pull, the second answers; a Release
    is recorded (and fails with ``release_fails``)."""

    def __init__(self, events: list, release_fails: bool = False) -> None:
        self.events = events
        self.release_fails = release_fails
        self.release_tracks: list = []

    def call(self, method, request, timeout, on_attempt=None, track=None):
        if method == "Release":
            self.events.append(("release", request.lease_token, request.consumer))
            self.release_tracks.append(track)
            if self.release_fails:
                raise BrokerUnavailableError("no broker answered Release")
            return pb.ReleaseReply()
        for address in ("broker-a", "broker-b"):
            on_attempt(address)
            self.events.append(("pull", address))
        return pb.PullReply()


def _client(events: list, release_fails: bool = False) -> Client:
    client = Client(Settings(brokers=("broker-a", "broker-b")))
    client.pool = _TwoBrokers(events, release_fails)
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


def test_the_release_before_the_next_broker_is_cancelled_with_the_pull():
    """A stopping worker cancels its pull: the release made on the pull's way to another broker
    goes with it, instead of holding the worker up to its own 5 s timeout."""
    client, handle = _client([]), PullHandle()
    client.pull("t", "worker-1", lease_token="ef" * 16, track=handle)
    assert client.pool.release_tracks == [handle]


def test_a_cancelled_pull_stops_waiting_for_a_broker_to_register():
    pool = BrokerPool(())  # no broker registered: a call waits for one until its deadline
    handle, outcome = PullHandle(), []
    caller = threading.Thread(target=lambda: outcome.append(_outcome(pool, handle)))
    caller.start()
    handle.cancel()
    caller.join(20)  # far less than the call's 60 s
    pool.close()
    assert not caller.is_alive() and isinstance(outcome[0], PullCancelledError)


def _outcome(pool: BrokerPool, handle: PullHandle):
    try:
        return pool.call("Pull", pb.PullRequest(topic="t", consumer="worker-1"), 60, track=handle)
    except TidemqError as exc:
        return exc


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
