"""tidemq.contrib.django in a real Django project (tests/django_project) on the session's
MariaDB: ``manage.py check`` names wrong settings and missing tables, ``manage.py tidemq_db``
creates the tables, a view creates an order and its close message in one transaction (a
rollback leaves neither), and ``manage.py tidemq_worker`` runs the consumer found in the app's
consumers.py, until SIGTERM drains it. Every Django process is a real subprocess; the web one
is Django's own server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import truncate
from tests.observe import all_messages, count
from tests.processes import start_broker_process
from tests.servers import free_port, wait_until
from tests.sqldb import open_sql
from tidemq_broker.storages import open_storage

PROJECT = Path(__file__).resolve().parents[1] / "django_project"
MANAGE = [sys.executable, str(PROJECT / "manage.py")]


def _env(mariadb, database: str, zk_hosts: str, **extra: str) -> dict[str, str]:
    return {"SHOP_DB_NAME": database, "SHOP_DB_PORT": str(mariadb.port), "SHOP_ZK_HOSTS": zk_hosts, **extra}


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([*MANAGE, *args], cwd=PROJECT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def shop(mariadb, zookeeper):
    """The project's database, migrated by Django, with tidemq's tables made by tidemq_db."""
    url = mariadb.create_database("django_shop")
    env = _env(mariadb, "django_shop", zookeeper.hosts, SHOP_TIDEMQ_DATABASE="default")
    for args in (["migrate", "--noinput"], ["tidemq_db", "init"]):
        done = manage(env, *args)
        assert done.returncode == 0, done.stdout + done.stderr
    storage, db = open_sql(url)
    yield url, db
    storage.close()


@pytest.fixture
def shop_url(shop, mariadb):
    url, db = shop
    truncate(db)
    mariadb.execute("DELETE FROM shop_order", "django_shop")
    return url


def _orders(mariadb) -> list[tuple]:
    return mariadb.execute("SELECT id, item, status, close_message FROM shop_order ORDER BY id", "django_shop")


class Site:
    """``manage.py runserver`` on a free port, and JSON requests to it."""

    def __init__(self, spawn, env: dict[str, str]) -> None:
        self.port = free_port()
        self.proc = spawn("web", [*MANAGE, "runserver", f"127.0.0.1:{self.port}", "--noreload"], env)
        wait_until(self._up, 60, 0.1, "Django's server")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(self.proc.log_path.read_text()[-3000:])
        try:
            self.get("/orders/0")
        except urllib.error.HTTPError:
            return True  # it answers (404: no such order)
        except OSError:
            return False
        return True

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as reply:
            return json.load(reply)

    def post(self, path: str, **form: str) -> tuple[int, dict]:
        body = urllib.parse.urlencode(form).encode()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", data=body, timeout=30) as reply:
                return reply.status, json.load(reply)
        except urllib.error.HTTPError as exc:
            return exc.code, {}


def test_check_names_a_wrong_setting_and_missing_tables_and_tidemq_db_makes_them(mariadb, zookeeper):
    mariadb.create_database("django_shop_new")
    env = _env(mariadb, "django_shop_new", zookeeper.hosts, SHOP_TIDEMQ_DATABASE="default")
    done = manage(env, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    missing = manage(env, "check", "--database", "default")
    assert "tidemq.W002" in missing.stderr, missing.stdout + missing.stderr
    assert "tidemq's tables are not in database 'default'" in missing.stderr
    made = manage(env, "tidemq_db", "init")
    assert made.returncode == 0 and "schema created" in made.stdout, made.stdout + made.stderr
    present = manage(env, "check", "--database", "default")
    assert present.returncode == 0 and "tidemq.W002" not in present.stderr, present.stderr
    assert ("tidemq_message",) in mariadb.execute("SHOW TABLES", "django_shop_new")

    for extra, says in (
        ({"ZK_HOST": "zk:2181"}, "TIDEMQ['ZK_HOST'] is not a tidemq setting; did you mean 'ZK_HOSTS'?"),
        ({"ZK_ROOT": "tidemq"}, "TIDEMQ['ZK_ROOT'] must be an absolute path like /tidemq, got 'tidemq'"),
        ({"RPC_TIMEOUT": "10"}, "TIDEMQ['RPC_TIMEOUT'] must be int or float, got str"),
        ({"DATABASE": "orders"}, "TIDEMQ['DATABASE'] names 'orders', which is not in settings.DATABASES (default)"),
    ):
        wrong = manage({**env, "SHOP_TIDEMQ_EXTRA": json.dumps(extra)}, "check")
        assert wrong.returncode != 0, extra
        assert "tidemq.E001" in wrong.stderr and says in wrong.stderr, wrong.stderr


def test_an_order_and_its_close_commit_together_and_the_worker_command_runs_it(
        shop_url, mariadb, zk_hosts, spawn, tmp_path):
    env = _env(mariadb, "django_shop", zk_hosts, SHOP_TIDEMQ_DATABASE="default")
    site = Site(spawn, env)
    storage = open_storage(shop_url)
    try:
        status, made = site.post("/orders", item="book", delay="0.5")
        assert status == 200 and made["message"], made
        status, _ = site.post("/orders", item="lamp", fail="1")  # the view fails after its enqueue
        assert status == 500
        assert [row[:3] for row in _orders(mariadb)] == [(made["order"], "book", "open")]
        [message] = all_messages(storage, "order.close")  # no message of the rolled-back order
        assert (message.id, json.loads(message.data), message.status) == (made["message"], {"order_id": made["order"]},
                                                                         "NEW")

        # A broker on the project's database, and the worker command with the app's consumer.
        start_broker_process(spawn, tmp_path, {"TIDEMQ_DB_URL": shop_url, "TIDEMQ_ZK_HOSTS": zk_hosts})
        worker = spawn("worker", [*MANAGE, "tidemq_worker", "--drain-timeout", "5"], env)
        wait_until(lambda: site.get(f"/orders/{made['order']}")["status"] == "closed", 60, 0.1, "the order closed")
        assert site.get(f"/orders/{made['order']}")["close_message"] == made["message"]
        wait_until(lambda: count(storage, "order.close", "SUCCESS") == 1, 30, 0.05, "the message SUCCESS")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.log_path.read_text()[-3000:]
        log = worker.log_path.read_text()
        assert "consuming order.close (QUEUE) with shop.consumers.close_order" in log
        assert "draining 1 consumer(s)" in log
    finally:
        storage.close()


def test_without_tidemq_tables_in_the_project_send_produces_through_brokers_on_commit(
        shop_url, mariadb, zk_hosts, spawn, tmp_path):
    start_broker_process(spawn, tmp_path, {"TIDEMQ_DB_URL": shop_url, "TIDEMQ_ZK_HOSTS": zk_hosts})
    site = Site(spawn, _env(mariadb, "django_shop", zk_hosts))  # no TIDEMQ['DATABASE']
    storage = open_storage(shop_url)
    try:
        status, made = site.post("/orders", item="book")
        assert status == 200 and made["message"] is None  # sent by transaction.on_commit
        assert site.post("/orders", item="lamp", fail="1")[0] == 500
        assert [row[1] for row in _orders(mariadb)] == ["book"]
        [message] = all_messages(storage, "order.close")  # committed before the response left
        assert json.loads(message.data) == {"order_id": made["order"]}
    finally:
        storage.close()


def test_the_worker_command_takes_the_worker_options(mariadb, zookeeper):
    env = _env(mariadb, "django_shop", zookeeper.hosts)
    helped = manage(env, "tidemq_worker", "--help")
    for option in ("--drain-timeout", "--concurrency", "--max-idle", "--metrics-port"):
        assert option in helped.stdout
    refused = manage(env, "tidemq_worker", "--max-idle", "0")
    assert refused.returncode != 0 and "--max-idle must be more than 0" in refused.stderr
