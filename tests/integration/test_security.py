"""Authentication and authorization on a real broker and MariaDB (TLS: test_tls.py): every RPC
needs a valid token, every role is checked against every RPC on its own and a foreign topic (the
database is checked afterwards), a revoked token stops working within seconds on every broker,
and anonymous requests cost the broker no memory."""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace

import pytest

from tests.integration.security_setup import client_of, principal, store  # noqa: F401 (store: a fixture)
from tests.processes import TIDEMQ
from tests.servers import wait_until
from tidemq import Client, clock
from tidemq.errors import (AuthenticationError, ConfigurationError,
                           PermissionDeniedError)
from tidemq.link import AckItem, AckOutcome, LeaseRef
from tidemq_broker.auth import new_token, token_hash
from tidemq_broker.server import BrokerServer
from tidemq_broker.storage import AckItem as StoredAck
from tidemq_broker.storage import LockRequest, NewRow, Shard, TopicSettings


# -- authentication -------------------------------------------------------------------------

RPCS = ("Produce", "Pull", "Ack", "Touch", "Extend", "Release", "Cancel", "Requeue", "PutSchedule", "Results")
#: RPCs that only read: an allowed call shows in what it returns, and never in the database.
READS = {"Results"}


class Case:
    """One message in the state an RPC needs (leased for Ack/Touch/Extend/Release, a dead
    letter for Requeue), the call to make, and how to tell whether it changed anything."""

    def __init__(self, store, rpc, topic):
        self.store, self.rpc, self.topic = store, rpc, topic
        now = clock.now()
        [self.id] = store.messages.insert_messages([NewRow(topic, '{"k": 1}', now, 0)], now)
        self.token = ""
        if rpc in ("Ack", "Touch", "Extend", "Release", "Requeue"):
            [leased] = store.leases.lock_batch(LockRequest(Shard(topic), "setup", 30, now, limit=1))
            self.token = leased.lease_token
        if rpc == "Requeue":
            store.acks.ack([StoredAck(self.id, self.token, False, "setup")], now, "setup", "setup", TopicSettings)
        self.before = self.snapshot()

    def snapshot(self):
        m = self.store.reads.get_message(self.id)  # None once cancelled
        counts = self.store.counts.count_by_status(self.topic).get(self.topic, {})
        return (m and (m.status, m.version, m.lease_expire,
                       m.trace)), counts, self.store.schedules.get_schedule(self.topic)

    def call(self, client):
        return {
            "Produce": lambda: client.produce(self.topic, {"k": 2}),
            "Pull": lambda: client.pull(self.topic, "tester", wait=0, max_messages=1),
            "Ack": lambda: client.ack(self.topic, "tester", [AckItem(self.id, self.token, True, "")]),
            "Touch": lambda: client.touch(self.id, self.token, 60),
            "Extend": lambda: client.extend([LeaseRef(self.id, self.token)], 60),
            "Release": lambda: client.release(self.token),
            "Cancel": lambda: client.cancel(self.id),
            "Requeue": lambda: client.requeue([self.id]),
            "PutSchedule": lambda: client.schedule(self.topic, self.topic, "0 3 * * *"),
            "Results": lambda: client.results([self.id]),
        }[self.rpc]()


@pytest.fixture
def auth_broker(settings):
    broker = BrokerServer(replace(settings, auth="token")).start()
    yield broker
    broker.stop(grace=1)


def test_every_rpc_without_a_token_with_a_wrong_one_and_with_a_revoked_one_is_unauthenticated(auth_broker, store):
    revoked = principal(store, "gone", "admin", ["*"])
    store.principals.revoke("gone", clock.now())
    wrong = new_token()
    for label, token in (("no token", ""), ("wrong token", wrong), ("revoked token", revoked)):
        client = client_of(auth_broker, token=token)
        try:
            for rpc in RPCS:
                case = Case(store, rpc, f"auth.{rpc.lower()}")
                with pytest.raises(AuthenticationError) as info:
                    case.call(client)
                assert case.snapshot() == case.before, f"{label}: {rpc} changed the database"
                assert "tidemq auth add" in str(info.value)
                assert not token or token not in str(info.value)  # the secret is never echoed
        finally:
            client.close()


def test_a_call_with_a_token_and_no_request_message_is_refused_naming_it(auth_broker, store):
    import grpc

    from tidemq.rpc import tidemq_pb2 as pb

    token = principal(store, "empty", "admin", ["*"])
    channel = grpc.insecure_channel(auth_broker.address)
    try:
        empty = channel.stream_unary("/tidemq.v1.Broker/Produce",
                                     request_serializer=pb.ProduceRequest.SerializeToString,
                                     response_deserializer=pb.ProduceReply.FromString)
        with pytest.raises(grpc.RpcError) as info:
            empty(iter(()), timeout=10, metadata=(("authorization", f"Bearer {token}"),))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no request" in info.value.details()
    finally:
        channel.close()


ALLOWED = {
    "producer": {"Produce", "Cancel", "Requeue", "PutSchedule", "Results"},
    "consumer": {"Pull", "Ack", "Touch", "Extend", "Release", "Results"},
    "admin": set(RPCS),
}


def test_each_role_against_each_rpc_on_its_own_and_a_foreign_topic(auth_broker, store):
    tokens = {role: principal(store, f"{role}-1", role) for role in ALLOWED}
    wrong = []
    for role, token in tokens.items():
        client = client_of(auth_broker, token=token)
        try:
            for rpc in RPCS:
                for topic, own in ((f"orders.{role}.{rpc.lower()}", True), (f"billing.{role}.{rpc.lower()}", False)):
                    case = Case(store, rpc, topic)
                    allowed = own and rpc in ALLOWED[role]
                    answer = None
                    try:
                        answer = case.call(client)
                        outcome = "allowed"
                    except PermissionDeniedError as exc:
                        outcome = "denied"
                        assert f"{role}-1" in str(exc) and rpc in str(exc)
                    changed = case.snapshot() != case.before
                    if rpc in READS:
                        assert not changed, f"{role} {rpc} changed the database"
                        changed = bool(answer and answer[0].found and answer[0].status is not None)
                    if outcome != ("allowed" if allowed else "denied") or changed != allowed:
                        wrong.append(f"{role} {rpc} on {topic}: {outcome}, changed={changed}")
        finally:
            client.close()
    assert not wrong, "\n".join(wrong)


def test_a_lease_pulled_through_the_broker_is_acked_by_its_own_topic_only(auth_broker, store):
    """Acks and heartbeats of a lease the broker granted are authorized on the topic it leased
    (lease_grants.py): another principal naming the same id and token is refused, and nothing
    changes; the puller's own heartbeat and ack apply."""
    orders = client_of(auth_broker, token=principal(store, "orders-w", "consumer", ["orders.*"]))
    billing = client_of(auth_broker, token=principal(store, "billing-w", "consumer", ["billing.*"]))
    admin = client_of(auth_broker, token=principal(store, "ops", "admin", ["*"]))
    try:
        [msg_id] = admin.produce_many("orders.lease", [{"k": 1}])
        [got] = orders.pull("orders.lease", "orders-w", wait=2, max_messages=1, ttr=30)
        before = store.reads.get_message(msg_id)
        for call in (lambda: billing.ack("billing.x", "billing-w", [AckItem(msg_id, got.lease_token, True, "")]),
                     lambda: billing.extend([LeaseRef(msg_id, got.lease_token)], 60),
                     lambda: billing.touch(msg_id, got.lease_token, 60)):
            with pytest.raises(PermissionDeniedError, match="orders.lease"):
                call()
        assert store.reads.get_message(msg_id) == before
        assert orders.extend([LeaseRef(msg_id, got.lease_token)], 60) == [True]
        assert orders.ack("orders.lease", "orders-w", [AckItem(msg_id, got.lease_token, True, "")]) \
            == [AckOutcome.APPLIED]
        assert store.reads.get_message(msg_id).status == "SUCCESS"
    finally:
        for c in (orders, billing, admin):
            c.close()


def test_a_revoked_token_stops_working_within_seconds_on_every_broker(settings, store, spawn, tmp_path):
    brokers = [BrokerServer(replace(settings, auth="token")).start() for _ in range(2)]
    token = principal(store, "svc", "producer", ["jobs.*"])
    clients = [client_of(b, token=token) for b in brokers]
    try:
        for c in clients:
            assert c.produce("jobs.a", 1) > 0
        revoke = subprocess.run(TIDEMQ + ["--db-url", settings.db_url, "auth", "revoke", "svc"],
                                capture_output=True, text=True, timeout=60)
        revoked_at = time.monotonic()
        assert revoke.returncode == 0, revoke.stderr

        def refused(client) -> bool:
            try:
                client.produce("jobs.a", 2)
                return False
            except AuthenticationError:
                return True

        for c in clients:
            wait_until(lambda: refused(c), 10, 0.05, "the revoked token to be refused")
        took = time.monotonic() - revoked_at
        assert took < 5, f"a revoked token kept working {took:.1f} s"
        print(f"\nrevoked token refused by both brokers after {took:.2f} s")
    finally:
        for c in clients:
            c.close()
        for b in brokers:
            b.stop(grace=1)


def test_the_auth_commands_show_tokens_once_and_never_list_them(settings, auth_broker, tmp_path):
    def tidemq(*args):
        return subprocess.run(TIDEMQ + ["--db-url", settings.db_url, "auth", *args],
                              capture_output=True, text=True, timeout=60)

    added = tidemq("add", "reporter", "--role", "consumer", "--topics", "reports.*,audit")
    assert added.returncode == 0, added.stderr
    token = added.stdout.splitlines()[0]
    assert token.startswith("tmq_")
    listed = tidemq("list")
    assert "reporter" in listed.stdout and "reports.*,audit" in listed.stdout
    assert token not in listed.stdout and token_hash(token) not in listed.stdout
    again = tidemq("add", "reporter", "--role", "admin", "--topics", "*")
    assert again.returncode == 2 and "revoke it first" in again.stderr
    bad = tidemq("add", "x", "--role", "consumer", "--topics", "orders.[a]")
    assert bad.returncode == 2 and "topic pattern" in bad.stderr
    client = client_of(auth_broker, token=token)
    try:
        assert client.pull("audit", "me", wait=0) == []
        with pytest.raises(PermissionDeniedError):
            client.pull("orders.x", "me", wait=0)
    finally:
        client.close()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    produce = subprocess.run(TIDEMQ + ["--brokers", auth_broker.address, "--token-file", str(token_file),
                                       "produce", "audit", "{}"], capture_output=True, text=True, timeout=60)
    assert produce.returncode == 2 and "'reporter' (consumer) may not call Produce" in produce.stderr
    assert token not in produce.stderr


# -- safe defaults --------------------------------------------------------------------------

def test_an_open_broker_on_a_reachable_address_refuses_to_start(settings):
    with pytest.raises(ConfigurationError, match="TIDEMQ_AUTH=token.*--insecure"):
        BrokerServer(settings, host="0.0.0.0")
    cli = subprocess.run(TIDEMQ + ["--db-url", settings.db_url, "broker", "--host", "0.0.0.0", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "--insecure" in cli.stderr


def test_a_forbidden_topic_in_a_shared_produce_call_fails_only_its_own_caller(auth_broker, store):
    """Concurrent produce() calls share RPCs; one caller's foreign topic must not deny the others."""
    import threading

    token = principal(store, "mixed", "producer", ["orders.*"])
    client = client_of(auth_broker, token=token)
    results: dict[str, object] = {}
    start = threading.Barrier(8)

    def produce(k: int) -> None:
        start.wait()
        topic = "billing.x" if k == 3 else "orders.shared"
        try:
            results[f"{k}"] = client.produce_many(topic, [{"k": k, "i": i} for i in range(50)])
        except PermissionDeniedError as exc:
            results[f"{k}"] = exc

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert isinstance(results["3"], PermissionDeniedError)
        assert all(isinstance(results[f"{k}"], list) for k in range(8) if k != 3), results
        assert store.counts.count_by_status("orders.shared")["orders.shared"] == {"NEW": 350}
        assert "billing.x" not in store.counts.count_by_status("billing.x")
    finally:
        client.close()


# -- memory before authentication ---------------------------------------------------------------

def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


def test_large_anonymous_requests_cost_the_broker_no_memory_while_a_client_keeps_producing(
        settings, store, spawn, tmp_path):
    """grpc reads a unary request whole before its handler runs: 96 anonymous 12 MiB Produce calls,
    24 at a time, made the broker hold up to 24 of them before the token check refused each one.
    The broker now reads a request only after its token is accepted."""
    import threading

    import grpc

    from tests.processes import process_env, start_broker_process
    from tidemq import Settings
    from tidemq.rpc import tidemq_pb2 as pb

    token = principal(store, "steady", "producer", ["steady.*"])
    proc, address = start_broker_process(spawn, tmp_path, process_env(settings, TIDEMQ_AUTH="token"))
    client = Client(Settings.from_env({}, brokers=(address,), token=token, rpc_timeout=30))
    stop, produced, errors = threading.Event(), [], []

    def keep_producing() -> None:
        while not stop.is_set():
            try:
                produced.append(client.produce("steady.t", {"n": len(produced)}))
            except Exception as exc:  # every failure is reported below
                errors.append(exc)

    big = pb.ProduceRequest(messages=[pb.NewMessage(topic="steady.t", data='"' + "x" * (12 << 20) + '"')])
    payload = big.SerializeToString()
    shared = grpc.insecure_channel(address)  # many streams on one connection, and one per caller
    codes: list[str] = []

    def anonymous(own_channel: bool) -> None:
        channel = grpc.insecure_channel(address) if own_channel else shared
        try:
            channel.unary_unary("/tidemq.v1.Broker/Produce", request_serializer=None,
                                response_deserializer=None)(payload, timeout=60)
            codes.append("OK")
        except grpc.RpcError as exc:
            codes.append(exc.code().name)
        finally:
            if own_channel:
                channel.close()

    producer = threading.Thread(target=keep_producing)
    try:
        for _ in range(20):  # the producer's path warmed up before the baseline is read
            client.produce("steady.t", {"warm": True})
        producer.start()
        wait_until(lambda: len(produced) >= 20, 30, what="the steady producer's first messages")
        before, during = _peak_rss_mib(proc.pid), len(produced)
        for _ in range(4):
            burst = [threading.Thread(target=anonymous, args=(i % 2 == 0,)) for i in range(24)]
            for t in burst:
                t.start()
            for t in burst:
                t.join(120)
        grown = _peak_rss_mib(proc.pid) - before
        during = len(produced) - during
        print(f"\nbroker peak RSS grew {grown:.1f} MiB under 96 anonymous 12 MiB requests; "
              f"{during} messages produced meanwhile")
        assert codes == ["UNAUTHENTICATED"] * 96
        assert grown < 24, f"the broker's peak memory grew {grown:.0f} MiB (two requests are 24 MiB)"
        assert during > 0 and not errors, errors[:3]
        stop.set()
        producer.join(30)
        # A valid caller still sends the largest batches: 60 messages of ~1 MB (60 MB in one
        # request, under the 64 MiB limit), and 10,000 small ones.
        assert len(client.produce_many("steady.bulk", ["y" * 999_990] * 60, timeout=120)) == 60
        assert len(client.produce_many("steady.many", [{"i": i} for i in range(10_000)], timeout=120)) == 10_000
        counts = store.counts.count_by_status()
        assert counts["steady.bulk"] == {"NEW": 60} and counts["steady.many"] == {"NEW": 10_000}
        assert counts["steady.t"] == {"NEW": 20 + len(produced)}
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(30)
        shared.close()
        client.close()
