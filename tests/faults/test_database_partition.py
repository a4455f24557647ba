"""One broker cut off from MariaDB while the other still reaches it (a relay between that broker
and the server, cut: its connections stay open and nothing passes, as in a network partition).

The cut-off broker finds that its statements get no answer and a new connection none either
(``storages/reach.py``); it shuts what it had in flight and answers every call UNAVAILABLE, so
producers and workers move to the other broker and go on; a Results call waiting there moves
too. Once the relay heals it serves again."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tests.background import InThread
from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.partition import Relay
from tests.faults.stack import Stack, reruns, successes
from tests.processes import process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, Settings, clock
from tidemq.errors import StorageUnavailableError
from tidemq_broker.storage import TopicSettings
from tidemq_broker.storages import mysql, open_database, open_storage

CUT = 12.0  # seconds the relay stays cut


def test_a_broker_cut_off_from_the_database_hands_its_callers_to_another(mysql_url, zk_hosts, spawn, tmp_path,
                                                                          record_property):
    topic, log = "fault.db.partition", tmp_path / "runs.log"
    server = urllib.parse.urlsplit(mysql_url)
    relay = Relay(f"{server.hostname}:{server.port}")
    settings = Settings.from_env({}, db_url=mysql_url, zk_hosts=zk_hosts)
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=topic, FAULT_TTR="3", FAULT_SLEEP="0.002")
    through = mysql_url.replace(f"{server.hostname}:{server.port}", relay.address, 1)
    client = Client(settings)
    load = ProduceLoad(client, topic, timeout=3.0, every=0.2)
    storage = open_storage(mysql_url)
    try:
        cut_off, cut_address = start_broker_process(spawn, tmp_path, {**env, "TIDEMQ_DB_URL": through}, "cut")
        stack = Stack(spawn, tmp_path, env, brokers=1, workers=2)
        stack.brokers["cut"] = cut_off
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 2, 30, what="two workers registered")
        wait_until(lambda: len(client.pool.addresses()) == 2, 30, what="two brokers discovered")
        load.start()
        # A caller waiting at the cut-off broker for a message that no worker runs.
        waited = client.produce(f"{topic}.waited", "waited")
        waiter = InThread(lambda: client.results([waited], wait=60.0, broker=cut_address))
        wait_until(lambda: successes(storage, topic) >= 500, 60, 0.1, "consumption before the partition")

        relay.cut()
        cut_at = time.monotonic()
        done = successes(storage, topic)
        # Consumption goes on through the other broker while the cut lasts (before the broker
        # could tell a silent database, none did: its pulls and acks waited out their deadlines).
        wait_until(lambda: successes(storage, topic) >= done + 500, CUT, 0.1, "consumption during the partition")
        consumed_by = time.monotonic() - cut_at
        # Its waiter moved to the other broker when the cut-off one found the silence: the
        # cancel, wherever it is recorded, ends the wait before the relay heals (not the
        # cut-off broker's probe finding it once it reaches the database again).
        assert client.cancel(waited)
        cancelled_at = time.monotonic()
        [state] = waiter.value(5.0)
        assert not state.found, state
        waiter_took = time.monotonic() - cancelled_at
        time.sleep(max(0.0, cut_at + CUT - time.monotonic()))
        during = successes(storage, topic) - done
        relay.heal()
        healed_at = time.monotonic()
        ok_during = load.succeeded_since(cut_at) - load.succeeded_since(healed_at)
        failed_during = load.failed_since(cut_at) - load.failed_since(healed_at)

        # The broker that was cut off serves again: a call sent to it alone succeeds.
        def served() -> bool:
            return stack.fault_records(r"answers this broker again")["cut"] != []

        wait_until(served, 30, 0.1, "the cut-off broker to find the database again")
        done = successes(storage, topic)
        wait_until(lambda: successes(storage, topic) >= done + 500, 30, 0.1, "consumption after the partition")
        load.stop()

        stack.assert_alive()
        figures = check_calls(load) + ", " + check_outcome(storage, topic, load.acked, log)
        twice = reruns(log)
        assert not twice, f"{len(twice)} messages ran twice, no worker died: {sorted(twice)[:5]}"
        # Calls that reached the cut-off broker before it knew may fail; the rest go elsewhere.
        assert ok_during > failed_during, f"during the cut {ok_during} produce calls succeeded, {failed_during} failed"
        named = stack.assert_fault_named_once(r"database", at_most=3)
        assert stack.fault_records(r"no answer from the database")["cut"], "the cut-off broker never named the fault"
        figures += (f", during the {CUT:.0f} s cut: consumed {during} (500 within {consumed_by:.1f} s), produce "
                    f"calls {ok_during} answered and {failed_during} failed, records naming it: {named}, "
                    f"the waiter's answer {waiter_took * 1000:.0f} ms after the cancel")
        record_property("figures", figures)
        print(f"\ndatabase partition: {figures}")
    finally:
        load.stop()
        client.close()
        storage.close()
        relay.close()


def test_a_transaction_cut_off_from_the_server_gives_its_row_locks_back(mysql_url, mysql_db, mysql_store,
                                                                       monkeypatch):
    """A broker cut off in the middle of a unit of work can neither commit nor roll back: the
    server holds that transaction's row locks until it ends the connection. Its idle time in a
    transaction is bounded (``mysql.IDLE_TRANSACTION_TIMEOUT``), not its 8 hours' wait_timeout."""
    with mysql_db.engine.connect() as conn:
        setting = conn.execute(text("SELECT @@SESSION.idle_transaction_timeout")).scalar()
    assert setting == mysql.IDLE_TRANSACTION_TIMEOUT == 30
    monkeypatch.setattr(mysql, "IDLE_TRANSACTION_TIMEOUT", 2)  # the same setting, without waiting 30 s
    mysql_store.topics.save_topic(TopicSettings("t.cut.held"), clock.now())
    server = urllib.parse.urlsplit(mysql_url)
    relay = Relay(f"{server.hostname}:{server.port}")
    engine = mysql.MySqlDialect().create_engine(
        mysql_url.replace(f"{server.hostname}:{server.port}", relay.address, 1), pool_size=1)
    held = "SELECT name FROM tidemq_topic WHERE name = 't.cut.held' FOR UPDATE"

    def free() -> bool:
        with mysql_db.engine.connect() as other:
            try:
                other.execute(text(held + " NOWAIT"))
                return True
            except OperationalError:  # 1205: the lock is held
                return False
            finally:
                other.rollback()

    holder = engine.connect()
    try:
        holder.execute(text(held))
        assert not free()
        relay.cut()  # until the end: the server is never told that the connection is gone
        cut_at = time.monotonic()
        wait_until(free, 15, 0.1, "the server to end the cut-off transaction")
        freed_after = time.monotonic() - cut_at
        print(f"\ncut-off transaction: its row lock given back {freed_after:.1f} s after the cut (idle limit 2 s)")
    finally:
        relay.close()
        with contextlib.suppress(Exception):
            holder.invalidate()
        engine.dispose(close=False)


def test_a_node_of_several_gone_silent_is_left_for_one_that_answers(mysql_url):
    """A URL naming several interchangeable servers (a Galera cluster) whose node in use is cut
    off from this process alone while another answers: the database is not out of reach. The
    connections to the silent node are shut, new ones go to the node that answers, and the units
    of work go on there. (Both addresses lead to one server here: the first through the relay.)"""
    server = urllib.parse.urlsplit(mysql_url)
    direct = f"{server.hostname}:{server.port}"
    relay = Relay(direct)
    db = open_database(mysql_url.replace(direct, f"{relay.address},{direct}", 1))
    done: list[float] = []
    failed: list[Exception] = []
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                db.tx(lambda conn: conn.execute(text("SELECT 1")).all())
                done.append(time.monotonic())
            except StorageUnavailableError as exc:  # a COMMIT in flight at the cut: its outcome unknown
                failed.append(exc)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    try:
        for worker in workers:
            worker.start()
        wait_until(lambda: len(done) >= 100, 10, what="units of work through the first address")
        assert db.dialect.addresses.current == ("127.0.0.1", int(relay.address.rsplit(":", 1)[1]))
        relay.cut()
        cut_at = time.monotonic()
        wait_until(lambda: sum(at > cut_at for at in done) >= 100, 20, 0.05, "units of work at the other address")
        resumed = min(at for at in done if at > cut_at) - cut_at
        assert not db.reach.out_of_reach, "one silent node of two was taken for the whole database"
        assert db.dialect.addresses.current == (server.hostname, server.port)
        print(f"\nsilent node: units of work went on at the other address {resumed:.1f} s after the cut, "
              f"{len(failed)} failed meanwhile")
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
        relay.close()
        db.close()
