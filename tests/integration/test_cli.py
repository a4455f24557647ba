"""The `tidemq` command as a user runs it: db init, produce, and a broker's clean SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import threading

from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client
from tidemq.errors import TidemqError
from tidemq_broker.schema import metadata
from tidemq_broker.storages import open_storage


def run(args, env=None, **kw):
    return subprocess.run(TIDEMQ + args, capture_output=True, text=True, timeout=120, env=env, **kw)


def test_db_init_creates_every_table(mariadb):
    url = mariadb.create_database("cli_init")
    result = run(["--db-url", url, "db", "init"])
    assert result.returncode == 0, result.stderr
    tables = {name for (name,) in mariadb.execute("SHOW TABLES", "cli_init")}
    assert tables == {t.name for t in metadata.sorted_tables}
    again = run(["--db-url", url, "db", "upgrade"])
    assert again.returncode == 0 and "already current" in again.stdout


def test_produce_from_the_shell_and_its_errors(settings, broker):
    env = {**process_env(settings)}
    import os

    env = {**os.environ, **env}
    ok = run(["produce", "cli.topic", '{"a": 1}', "--delay", "60", "--unique-key", "k1"], env=env)
    assert ok.returncode == 0, ok.stderr
    msg_id = int(ok.stdout.strip())
    stored = broker.storage.reads.get_message(msg_id)
    assert stored.data == '{"a":1}' and stored.status == "NEW" and stored.unique_key == "k1"
    same = run(["produce", "cli.topic", '{"a": 2}', "--unique-key", "k1"], env=env)
    assert int(same.stdout.strip()) == msg_id
    bad_json = run(["produce", "cli.topic", "{nope"], env=env)
    assert bad_json.returncode == 2 and "DATA must be JSON text" in bad_json.stderr
    bad_topic = run(["produce", "bad topic", "1"], env=env)
    assert bad_topic.returncode == 2 and "characters outside [A-Za-z0-9._:-]" in bad_topic.stderr


def test_broker_sigterm_finishes_calls_and_exits_cleanly(settings, spawn, tmp_path):
    proc, address = start_broker_process(spawn, tmp_path, process_env(settings))
    client = Client(settings.__class__(**{**vars(settings), "brokers": (address,)}))
    acked: list[int] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def produce_loop():
        while not stop.is_set():
            try:
                acked.extend(client.produce_many("term.t", [{}] * 20, timeout=5))
            except TidemqError as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=produce_loop)
    storage = open_storage(settings.db_url)
    try:
        thread.start()
        wait_until(lambda: len(acked) >= 500, 60, what="produce under way")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        stop.set()
        thread.join(30)
        assert errors, "calls after the shutdown must fail (the broker is gone)"
        stored = storage.counts.count_by_status("term.t").get("term.t", {}).get("NEW", 0)
        assert stored >= len(acked)
        assert "stopped" in proc.log_path.read_text()
    finally:
        stop.set()
        client.close()
        storage.close()
