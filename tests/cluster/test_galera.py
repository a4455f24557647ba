"""tidemq on a 3-node MariaDB Galera cluster: several database addresses in one URL and moving
to another node when one dies, certification conflicts retried, sequential produces through
brokers on different nodes kept in order, and QUEUE shards split evenly although every node
hands out ids of its own residue (auto_increment_increment = 3)."""

from __future__ import annotations

import collections
import dataclasses
import threading

import pytest

from tests.background import InThread
from tests.integration.handlers_common import read_log
from tests.processes import start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, Settings, clock
from tidemq_broker.server import BrokerServer
from tidemq_broker.storage import LockRequest, NewRow, Shard, WorkflowStep
from tests.sqldb import open_sql
from tidemq_broker.storages import open_storage


def _rows(topic, n, start=0):
    now = clock.now()
    return [NewRow(topic, f'{{"n": {start + i}}}', now, 0) for i in range(n)]


@pytest.fixture
def on_node(galera, galera_url):
    """``on_node(i)``: a storage whose URL names node i first, then the others, and its database
    object (which node it is connected to, which session settings its connections have)."""
    opened = []

    def open_on(index: int):
        order = [index] + [i for i in range(len(galera.nodes)) if i != index]
        storage, db = open_sql(galera_url.replace(galera.addresses(), galera.addresses(order)))
        opened.append(storage)
        return storage, db

    yield open_on
    for storage in opened:
        storage.close()


def _conflicts(galera) -> int:
    """Transactions the cluster's nodes failed in certification or aborted for a replicated one."""
    return sum(int(node.execute("SHOW GLOBAL STATUS LIKE 'wsrep_local_cert_failures'")[0][1]) +
               int(node.execute("SHOW GLOBAL STATUS LIKE 'wsrep_local_bf_aborts'")[0][1])
               for node in galera.nodes)


def _node_port(db) -> int:
    return db.tx(lambda conn: int(conn.exec_driver_sql("SELECT @@port").scalar()))


def test_a_storage_moves_to_the_next_address_when_its_node_dies(galera, on_node):
    storage, db = on_node(2)
    assert _node_port(db) == galera.nodes[2].port
    before = storage.messages.insert_messages(_rows("g.move", 20), clock.now())
    galera.kill(2)
    after = storage.messages.insert_messages(_rows("g.move", 20, 20), clock.now())  # no error reaches the caller
    assert _node_port(db) == galera.nodes[0].port
    assert min(after) > max(before)
    assert [storage.reads.get_message(i).data for i in before + after] == [f'{{"n": {n}}}' for n in range(40)]
    galera.start_node(2)
    assert galera.size() == 3
    assert _node_port(db) == galera.nodes[0].port  # it stays where it moved


def test_a_url_with_no_serving_address_fails_with_the_addresses_named(galera):
    from tests.servers import free_port
    from tidemq.errors import StorageUnavailableError

    dead = [free_port(), free_port()]
    storage = open_storage(f"mysql+pymysql://root@127.0.0.1:{dead[0]},127.0.0.1:{dead[1]}/tidemq_test")
    try:
        with pytest.raises(StorageUnavailableError) as info:
            storage.counts.count_by_status()
        assert f"127.0.0.1:{dead[0]}" in str(info.value) and f"127.0.0.1:{dead[1]}" in str(info.value)
    finally:
        storage.close()


def test_a_malformed_address_list_is_refused_naming_the_expected_form():
    from tidemq.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="host1:3306,host2:3306"):
        open_storage("mysql+pymysql://root@127.0.0.1:3306,127.0.0.1:port/tidemq")


def test_certification_conflicts_between_nodes_are_retried_and_nothing_is_leased_twice(galera, on_node):
    """Two brokers on different nodes lock the same topic: each node only sees its own row locks,
    so both may take the same rows; certification lets one commit win and the other gets a
    deadlock error at COMMIT, which the storage retries. Only leases of the same rows meet, in a
    window of a round trip: the takers start together, and rounds run until conflicts were seen."""
    (a, _), (b, _) = on_node(0), on_node(1)

    seen_before = _conflicts(galera)
    for round_ in range(30):
        topic = f"g.conflict{round_}"
        ids = a.messages.insert_messages(_rows(topic, 400), clock.now())
        wait_until(lambda: b.counts.count_by_status(topic).get(topic, {}).get("NEW") == 400, 30, what="rows replicated")

        start = threading.Barrier(4)

        def take(storage):
            got = []
            start.wait(30)  # the four takers race for the same first rows
            while True:
                batch = storage.leases.lock_batch(LockRequest(Shard(topic), "c", 30, clock.now(), limit=20))
                if not batch:
                    return got
                got += [m.id for m in batch]

        runs = [InThread(take, s) for s in (a, b, a, b)]
        taken = [i for run in runs for i in run.value(60)]
        assert sorted(taken) == ids  # every message leased exactly once
        if _conflicts(galera) > seen_before:
            break
    assert _conflicts(galera) > seen_before, "no certification conflict in 30 rounds"


def test_produces_of_one_topic_through_two_nodes_at_once_do_not_conflict(galera, on_node):
    """A node certifies a writeset by the unique-key values of the rows it writes. A message
    without a unique key must have none: when (topic, NULL) was one, every insert of a topic
    through one node conflicted with every concurrent insert of it through another (retried up
    to twelve times, and once a produce failed). Keyed messages with different keys do not meet
    either; the cluster's certification failures and aborts are counted around the produces."""
    storages = [on_node(0)[0], on_node(1)[0]]

    def produce(index: int) -> list[int]:
        ids = []
        for n in range(150):
            rows = _rows("g.together", 20, 20 * (2 * n + index))
            if n % 3 == 0:  # keyed rows among them, each key once
                rows = [dataclasses.replace(row, unique_key=f"k{index}-{n}-{i}") for i, row in enumerate(rows)]
            ids += storages[index].messages.insert_messages(rows, clock.now())
        return ids

    before = _conflicts(galera)
    runs = [InThread(produce, index) for index in (0, 1)]
    ids = [i for run in runs for i in run.value(120)]
    assert len(set(ids)) == 2 * 150 * 20
    assert _conflicts(galera) == before


def test_produce_connections_wait_for_earlier_cluster_writes_and_others_do_not(on_node):
    """Produce's INSERTs wait until the node has applied what the cluster committed before them
    (the order test below relies on it); the lock and ack paths do not pay for the wait."""
    _, db = on_node(1)

    def sync_wait(conn):
        return int(conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar())

    assert db.tx(sync_wait, produce=True) & 5 == 5  # reads (bit 1) and INSERTs (bit 4)
    assert not db.tx(sync_wait) & 5


def test_a_dependency_committed_through_another_node_a_moment_before_is_found(on_node):
    """A submission reads the messages it waits on through its own node: each must be found
    there even when it was committed through another node just before."""
    first, _ = on_node(0)
    second, _ = on_node(1)
    for n in range(30):
        [parent] = first.messages.insert_messages(_rows("g.deps", 1, n), clock.now())
        [child] = second.dependencies.insert_steps([WorkflowStep(_rows("g.deps.child", 1, n)[0], (parent,), ())],
                                                   clock.now(), broker="b2")
        assert second.reads.get_message(child).deps_left == 1


def _broker_on(galera, galera_url, zk_hosts, node):
    order = [node] + [i for i in range(len(galera.nodes)) if i != node]
    settings = Settings.from_env({}, db_url=galera_url.replace(galera.addresses(), galera.addresses(order)),
                                 zk_hosts=zk_hosts)
    return BrokerServer(settings).start()


@pytest.fixture(params=[(0, 0), (0, 1)], ids=["one-writer-node", "one-node-each"])
def two_brokers(request, galera, galera_url, zk_hosts):
    """Two brokers, on the same node (the same address list) or on a node each, and a client
    pinned to each."""
    brokers = [_broker_on(galera, galera_url, zk_hosts, node) for node in request.param]
    clients = [Client(Settings.from_env({}, zk_hosts=zk_hosts, brokers=(b.address,))) for b in brokers]
    yield brokers, clients
    for c in clients:
        c.close()
    for b in brokers:
        b.stop(grace=1)


def test_sequential_produces_through_brokers_on_different_nodes_keep_their_order(two_brokers, galera, spawn,
                                                                                   tmp_path, zk_hosts, galera_url):
    """A SERIAL_QUEUE producer alternating between two brokers (on two nodes): each produce is
    acknowledged before the next is sent, so each must get a later id, and run later."""
    brokers, clients = two_brokers
    topic = "g.serial"
    ids = [clients[k % 2].produce(topic, {"k": k}) for k in range(200)]
    assert ids == sorted(ids) and len(set(ids)) == 200
    log = tmp_path / "runs.log"
    env = {"TIDEMQ_DB_URL": galera_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "HANDLER_LOG": str(log),
           "HANDLER_TOPIC": topic, "HANDLER_SLEEP": "0"}
    start_worker(spawn, "serial", "tests.integration.handlers_serial", env)
    wait_until(lambda: len([e for e in read_log(log) if e.end is not None]) == 200, 120, 0.1, "200 serial runs")
    assert [e.id for e in read_log(log) if e.end is not None] == ids


def test_three_consumers_of_a_topic_produced_through_two_brokers_each_get_a_third(two_brokers, spawn, tmp_path,
                                                                                  zk_hosts, galera_url):
    brokers, clients = two_brokers
    topic = "g.split"
    log = tmp_path / "runs.log"
    for i in range(3):
        env = {"TIDEMQ_DB_URL": galera_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "TIDEMQ_BROKERS": brokers[i % 2].address,
               "HANDLER_LOG": str(log), "HANDLER_TOPIC": topic, "HANDLER_SLEEP": "0"}
        start_worker(spawn, f"w{i}", "tests.integration.handlers_queue", env)
    wait_registered(clients[0].coordinator, topic, 3)
    total = 3000

    def produce(client, start):
        for k in range(start, total, 2 * 100):
            client.produce_many(topic, [{"n": n} for n in range(k, min(k + 100, total))])

    producers = [InThread(produce, clients[0], 0), InThread(produce, clients[1], 100)]
    for p in producers:
        p.value()
    wait_until(lambda: len({e.id for e in read_log(log)}) == total, 180, 0.1, f"{total} messages run")
    per_consumer = collections.Counter(e.pid for e in read_log(log))
    storage = open_storage(galera_url)
    try:
        step = storage.probes.id_step()
    finally:
        storage.close()
    # The shards (MOD(id DIV step, 3)) split the ids evenly whatever node handed them out. Who
    # ran each may differ a little: a message left due past the grace by a busy consumer is
    # taken by another (the stranded rule), so the consumers' shares are only all non-zero.
    shards = collections.Counter((i // step) % 3 for i in {e.id for e in read_log(log)})
    shares = sorted(n / total for n in shards.values())
    print(f"\nshards of three consumers: {[f'{s:.1%}' for s in shares]}; "
          f"runs per consumer {sorted(per_consumer.values())}")
    assert len(per_consumer) == 3 and len(shards) == 3
    assert all(abs(share - 1 / 3) <= 0.05 for share in shares), shares
