"""Session-wide real servers and per-test isolation.

MariaDB, ZooKeeper and Prometheus start once per session from Debian's packages (`make test` installs them).
A server that cannot start makes every test that needs it error: it is never a skip.
Each test gets truncated tables and its own ZooKeeper chroot.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from kazoo.client import KazooClient

from tests import failure_context
from tests.galera import GaleraCluster
from tests.servers import MariaDB, Prometheus, ZooKeeper, ZooKeeperEnsemble


def truncate(db) -> None:
    """Delete every row of tidemq's tables except the schema version (per-test isolation)."""
    from sqlalchemy import delete

    from tidemq_broker.schema import metadata, schema_version

    def work(conn) -> None:
        for table in reversed(metadata.sorted_tables):
            if table is not schema_version:
                conn.execute(delete(table))

    db.tx(work)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The servers started, stopped or killed from here on are this test's (its report names them)."""
    failure_context.forget_touched()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails in its setup or its body reports its processes' and servers' last log
    lines (tests/failure_context.py): CI keeps nothing else of a run."""
    report = (yield).get_result()
    if report.failed and report.when in ("setup", "call"):
        report.sections.extend(failure_context.sections(getattr(item, "funcargs", {}), failure_context.touched()))


@pytest.fixture(scope="session")
def mariadb():
    server = MariaDB().start()
    yield server
    server.cleanup()


def _session_store(server):
    """The test database on ``server`` (a MariaDB or a Galera cluster) with the schema: (url, database)."""
    from tidemq_broker.storages import open_database, sql_storage

    url = server.create_database("tidemq_test")
    db = open_database(url)
    sql_storage(db).schema.create_schema()
    yield url, db
    db.close()


@pytest.fixture(scope="session")
def _mysql_store(mariadb):
    yield from _session_store(mariadb)


@pytest.fixture
def mysql_url(_mysql_store):
    """A MariaDB database with the schema and no rows."""
    url, db = _mysql_store
    truncate(db)
    return url


@pytest.fixture
def mysql_db(mysql_url, _mysql_store):
    """The database object of ``mysql_url``: the test's own connections to it, to stand in for
    the pipeline, change rows behind the storage's back or read tables directly."""
    return _mysql_store[1]


@pytest.fixture
def mysql_store(mysql_url):
    """A storage opened on ``mysql_url`` (MariaDB, tables truncated), closed after the test."""
    from tidemq_broker.storages import open_storage

    storage = open_storage(mysql_url)
    yield storage
    storage.close()


@pytest.fixture(scope="session")
def galera():
    """A 3-node MariaDB Galera cluster (galera-4), started once for the session."""
    cluster = GaleraCluster(3).start()
    yield cluster
    cluster.cleanup()


@pytest.fixture(scope="session")
def _galera_store(galera):
    yield from _session_store(galera)


@pytest.fixture
def galera_url(_galera_store, galera):
    """The cluster's database (every node's address in the URL) with the schema and no rows.

    Nodes a test killed are started again after it."""
    url, db = _galera_store
    truncate(db)
    yield url
    for index, node in enumerate(galera.nodes):
        if node.proc is None or node.proc.poll() is not None:
            galera.start_node(index)


def _open_store(request, tmp_path):
    from tidemq_broker.storages import open_storage
    from tidemq_broker.storages.memory import open_memory_storage

    if request.param == "memory":
        store = open_memory_storage()
    elif request.param == "sqlite":
        store = open_storage(f"sqlite:///{tmp_path}/store.sqlite3")
        store.schema.create_schema()
    else:
        store = open_storage(request.getfixturevalue(f"{request.param}_url"))
    return store


@pytest.fixture(params=["memory", "sqlite", "mysql", "galera"])
def any_storage(request, tmp_path):
    """Each storage implementation in turn (the conformance suite): a fresh memory storage, a
    fresh SQLite file, MariaDB's truncated tables, then the same on a 3-node Galera cluster."""
    store = _open_store(request, tmp_path)
    yield store
    store.close()


@pytest.fixture(params=["memory", "sqlite", "mysql"])
def console_storage(request, tmp_path):
    """The memory storage, SQLite, then one MariaDB server: for tests of the console's pages,
    which count on consecutive ids (a Galera node's step by the cluster size)."""
    store = _open_store(request, tmp_path)
    yield store
    store.close()


@pytest.fixture(scope="session")
def zookeeper():
    server = ZooKeeper().start()
    yield server
    server.cleanup()


def _new_chroot(hosts: str) -> str:
    """Create a fresh chroot path on ``hosts`` and return it."""
    chroot = f"/test-{uuid.uuid4().hex[:12]}"
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=30)
    zk.ensure_path(chroot)
    zk.stop()
    zk.close()
    return chroot


@pytest.fixture
def zk_hosts(zookeeper):
    """A connection string with a chroot of this test's own."""
    return zookeeper.hosts + _new_chroot(zookeeper.hosts)


@pytest.fixture(scope="session")
def prometheus():
    """A real Prometheus (Debian's package) scraping every second; tests add their targets."""
    server = Prometheus().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def ensemble():
    """A 3-node ZooKeeper ensemble shared by the tests that kill its members."""
    servers = ZooKeeperEnsemble().start()
    yield servers
    servers.cleanup()


@pytest.fixture
def ensemble_chroot(ensemble):
    """This test's chroot on the ensemble; members killed by the test are started again after it."""
    yield _new_chroot(ensemble.hosts)
    for member in ensemble.members:
        if member.proc is None or member.proc.poll() is not None:
            member.start()


@pytest.fixture(autouse=True)
def _fresh_process_state():
    """In-process coordination and the consumer registry start empty in every test."""
    from tidemq.consumer import clear_registry
    from tidemq.coordinators.local import reset_local_state

    reset_local_state()
    clear_registry()
    yield
    clear_registry()


@pytest.fixture
def spawn(tmp_path):
    """Start real processes (``spawn(name, args, env)``); each is SIGKILLed at teardown."""
    procs = []

    def start(name, args, env=None):
        log = open(tmp_path / f"{name}.log", "ab")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=os.getcwd())
        proc.name, proc.log_path = name, tmp_path / f"{name}.log"
        procs.append(proc)
        return proc

    start.procs = procs  # read by a failure's report (pytest_runtest_makereport)
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def settings(mysql_url, zk_hosts):
    """Settings pointing at this test's database and ZooKeeper chroot."""
    from tidemq import Settings

    return Settings.from_env({}, db_url=mysql_url, zk_hosts=zk_hosts)


@pytest.fixture
def broker(settings):
    """An in-process broker on MariaDB, registered in this test's ZooKeeper chroot."""
    from tidemq_broker.server import BrokerServer

    server = BrokerServer(settings).start()
    yield server
    server.stop(grace=1)


@pytest.fixture
def client(settings, broker):
    """A client that discovers the broker through ZooKeeper."""
    from tests.servers import wait_until
    from tidemq import Client

    c = Client(settings)
    wait_until(lambda: broker.address in c.pool.addresses(), 10, what="broker discovery")
    yield c
    c.close()
