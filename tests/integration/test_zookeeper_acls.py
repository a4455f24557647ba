"""ZooKeeper ACLs (TIDEMQ_ZK_AUTH) against a real ZooKeeper: tidemq's nodes are readable by anyone
and writable only with the digest credentials; tidemq with them still works end to end; nodes
made before the credentials were set get the ACL on start; other credentials are refused clearly.

The broker, client and consumers here use this module's ``settings`` (with zk_auth), which the
``broker`` and ``client`` fixtures of tests/conftest.py pick up.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from contextlib import contextmanager

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE, make_acl

from tests.servers import wait_until
from tidemq import Message, MessageType, Settings, Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.zk_acl import node_acl
from tidemq.coordinators.zookeeper import ZooKeeperCoordinator
from tidemq.errors import CoordinationError

AUTH = "tidemq-ops:s3cret:with-colon"
PASSWORD = AUTH.partition(":")[2]
ROOT = "/tidemq"
TOPIC = "acl.orders"
NEWS = "acl.news"


@pytest.fixture
def settings(mysql_url, zk_hosts):
    """This test's database and chroot, with ZooKeeper digest credentials."""
    return Settings.from_env({"TIDEMQ_ZK_AUTH": AUTH}, db_url=mysql_url, zk_hosts=zk_hosts)


@contextmanager
def kazoo(hosts, auth=None):
    """A plain kazoo client, with digest credentials ``auth`` or none."""
    zk = KazooClient(hosts=hosts, auth_data=[("digest", auth)] if auth else None)
    zk.start(timeout=30)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def walk(zk, path):
    """Every node at and below ``path`` (ephemeral ones that vanish meanwhile are skipped)."""
    try:
        children = zk.get_children(path)
    except NoNodeError:
        return []
    return [path] + [node for child in children for node in walk(zk, posixpath.join(path, child))]


def assert_every_node_has_the_acl(hosts):
    """Ours, the makepath parents, the election's: every node under the root carries tidemq's ACL.

    Read with the credentials: ZooKeeper hides the digest hash of an ACL from other sessions."""
    with kazoo(hosts, AUTH) as zk:
        nodes = walk(zk, ROOT)
        assert posixpath.join(ROOT, "leader", "election") in nodes
        for path in nodes:
            try:
                assert sorted(zk.get_acls(path)[0]) == sorted(node_acl(AUTH)), path
            except NoNodeError:
                pass  # an ephemeral clock node of the broadcast pruner, gone meanwhile


def run_worker(client, *specs):
    worker = Worker(list(specs), client=client, drain_timeout=5).start()
    for spec in specs:
        wait_until(lambda: client.coordinator.consumers(spec.topic), 10, what=f"registration of {spec.topic}")
    return worker


@pytest.mark.parametrize("credentials", [None, "tidemq-ops:wrong"], ids=["no-credentials", "wrong-credentials"])
def test_others_can_read_tidemq_nodes_but_not_change_them(zk_hosts, broker, client, credentials):
    worker = run_worker(client, ConsumerSpec(TOPIC, MessageType.QUEUE, lambda m: None))
    try:
        seq = client.broadcast(NEWS, {"hello": "world"})
        wait_until(lambda: broker.coordinator.leader(), 10, what="a maintenance leader")
        consumer_node = client.coordinator.consumers(TOPIC)[0]
        targets = [
            ROOT,
            posixpath.join(ROOT, "brokers", broker.address),
            posixpath.join(ROOT, "consumers", TOPIC, consumer_node),
            posixpath.join(ROOT, "broadcast", NEWS, f"m-{seq:010d}"),
            posixpath.join(ROOT, "signals", TOPIC),  # made by the broker's watch of TOPIC's releases
            posixpath.join(ROOT, "cancels", TOPIC),  # made by the worker's watch of TOPIC's cancels
        ]
        wait_until(lambda: client.coordinator._zk.exists(targets[4]), 10, what="the signal node of the topic")
        wait_until(lambda: client.coordinator._zk.exists(targets[5]), 10, what="the cancel node of the topic")
        assert_every_node_has_the_acl(zk_hosts)
        with kazoo(zk_hosts, credentials) as intruder:
            # Readable: what operators and read-only tools need.
            assert sorted(intruder.get_children(ROOT)) == ["broadcast", "brokers", "cancels", "consumers", "leader",
                                                           "signals"]
            assert broker.address in intruder.get_children(posixpath.join(ROOT, "brokers"))
            assert intruder.get_children(posixpath.join(ROOT, "consumers", TOPIC)) == [consumer_node]
            before = {path: intruder.get(path) for path in targets}
            assert b"world" in before[targets[3]][0]
            # Not writable, in any way.
            for path in targets:
                with pytest.raises(NoAuthError):
                    intruder.set(path, b"tampered")
                with pytest.raises(NoAuthError):
                    intruder.create(posixpath.join(path, "intruder"))
                with pytest.raises(NoAuthError):
                    intruder.set_acls(path, OPEN_ACL_UNSAFE)
                with pytest.raises(NoAuthError):
                    # The root's own entry belongs to its parent (the chroot, not tidemq's): a
                    # recursive delete must fail on tidemq's children first.
                    intruder.delete(path, recursive=path == ROOT)
            for sub in ("brokers", "consumers", "broadcast", "leader"):
                with pytest.raises(NoAuthError):
                    intruder.delete(posixpath.join(ROOT, sub), recursive=True)
            assert {path: intruder.get(path) for path in targets} == before
            assert broker.address in intruder.get_children(posixpath.join(ROOT, "brokers"))
        assert broker.address in client.pool.addresses()
        assert client.coordinator.consumers(TOPIC) == [consumer_node]
    finally:
        worker.stop()


def test_tidemq_with_the_credentials_works_end_to_end(broker, client):
    count = 40
    ran: set[int] = set()
    news: list[object] = []
    all_ran = threading.Event()

    def handle(message: Message) -> None:
        ran.add(message.id)
        if len(ran) == count:
            all_ran.set()

    worker = run_worker(client,
                        ConsumerSpec(TOPIC, MessageType.QUEUE, handle, threads=4, ttr=30, batch=8),
                        ConsumerSpec(NEWS, MessageType.TOPIC, lambda m: news.append(m.data)))
    try:
        ids = set(client.produce_many(TOPIC, [{"i": i} for i in range(count)]))
        client.broadcast(NEWS, "one")
        client.broadcast(NEWS, "two")
        assert all_ran.wait(30), f"only {len(ran)} of {count} messages ran"
        wait_until(lambda: news == ["one", "two"], 10, what="both broadcasts")
    finally:
        worker.stop()
    assert ran == ids
    wait_until(lambda: all(broker.storage.reads.get_message(i).status == "SUCCESS" for i in ids), 10,
               what="every ack recorded")


def test_nodes_made_without_credentials_get_the_acl_on_start(zk_hosts, caplog):
    open_coordinator = ZooKeeperCoordinator(zk_hosts, ROOT)
    open_coordinator.start()
    reg = open_coordinator.register_consumer(TOPIC, "old")
    open_coordinator.unregister_consumer(reg)
    open_coordinator.stop()
    with kazoo(zk_hosts) as zk:
        assert zk.get_acls(posixpath.join(ROOT, "brokers"))[0] == OPEN_ACL_UNSAFE

    secured = ZooKeeperCoordinator(zk_hosts, ROOT, auth=AUTH)
    with caplog.at_level(logging.WARNING, logger="tidemq.coordinators.zookeeper"):
        secured.start()
    try:
        upgraded = [ROOT] + [posixpath.join(ROOT, sub) for sub in ("brokers", "consumers", "broadcast", "leader")]
        upgraded.append(posixpath.join(ROOT, "consumers", TOPIC))
        assert "made without it" in caplog.text and all(path in caplog.text for path in upgraded)
        assert PASSWORD not in caplog.text
        with kazoo(zk_hosts, AUTH) as zk:
            for path in upgraded:
                assert sorted(zk.get_acls(path)[0]) == sorted(node_acl(AUTH)), path
        with kazoo(zk_hosts) as intruder:
            with pytest.raises(NoAuthError):
                intruder.create(posixpath.join(ROOT, "brokers", "10.0.0.9:50051"), ephemeral=True)
        secured.register_broker("10.0.0.1:50051")
        assert secured.consumers(TOPIC) == []
    finally:
        secured.stop()
    caplog.clear()
    operators = node_acl(AUTH) + [make_acl("ip", "127.0.0.1", read=True)]  # an entry an operator added
    with kazoo(zk_hosts, AUTH) as zk:
        zk.set_acls(ROOT, operators)
    again = ZooKeeperCoordinator(zk_hosts, ROOT, auth=AUTH)
    with caplog.at_level(logging.WARNING, logger="tidemq.coordinators.zookeeper"):
        again.start()  # already secured: nothing to set, nothing logged
    again.stop()
    assert "made without it" not in caplog.text
    with kazoo(zk_hosts, AUTH) as zk:
        assert sorted(zk.get_acls(ROOT)[0]) == sorted(operators)


def test_a_process_with_other_credentials_or_none_is_refused_clearly(zk_hosts):
    owner = ZooKeeperCoordinator(zk_hosts, ROOT, auth=AUTH)
    owner.start()
    owner.register_consumer(TOPIC, "owner")
    try:
        other = ZooKeeperCoordinator(zk_hosts, ROOT, auth="tidemq-ops:rotated")
        with pytest.raises(CoordinationError, match="TIDEMQ_ZK_AUTH") as refused:
            other.start()
        assert "rotated" not in str(refused.value) and PASSWORD not in str(refused.value)

        reader = ZooKeeperCoordinator(zk_hosts, ROOT)  # no credentials: may look, not write
        reader.start()
        try:
            assert len(reader.consumers(TOPIC)) == 1
            with pytest.raises(CoordinationError, match="NoAuthError.*TIDEMQ_ZK_AUTH"):
                reader.register_consumer(TOPIC, "reader")
            with pytest.raises(CoordinationError, match="NoAuthError.*TIDEMQ_ZK_AUTH"):
                reader.broadcast(NEWS, b"x")
            with pytest.raises(CoordinationError, match="NoAuthError.*TIDEMQ_ZK_AUTH"):
                reader.register_broker("10.0.0.2:50051")
        finally:
            reader.stop()
        assert len(owner.consumers(TOPIC)) == 1
    finally:
        owner.stop()
