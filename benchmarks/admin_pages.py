"""Console page times on a million messages in MariaDB.

    .venv/bin/python -m benchmarks.admin_pages [--rows 1000000]

Fills a throwaway MariaDB with ``--rows`` messages over 8 topics (mostly SUCCESS, with FAIL,
NEW due and delayed, and RUNNING rows, as a busy installation has) using multi-row INSERTs,
then requests each list page through the Flask app, which includes the query, the template and
the response: the server's time, without the network. Prints median and worst of each page.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from datetime import datetime, timedelta

import pymysql

from tests.servers import MariaDB

TOPICS = [f"bench.topic{i}" for i in range(8)]
ROWS_PER_INSERT = 2000


def _status(r: float) -> str:
    if r < 0.93:
        return "SUCCESS"
    if r < 0.96:
        return "FAIL"
    if r < 0.995:
        return "NEW"
    return "RUNNING"


def fill(server: MariaDB, database: str, rows: int) -> float:
    """Insert ``rows`` messages with multi-row INSERTs; return the seconds it took."""
    rnd = random.Random(7)
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", database=database, autocommit=False)
    base = datetime(2024, 1, 1)
    cols = ("topic, data, status, effect_time, order_time, retry_remaining, attempt, version, trace, "
            "add_time, update_time, unique_key")
    started = time.perf_counter()
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO tidemq_topic (name, retry_count, retry_base, retry_max, ttr, retention_days, "
                        "paused, description, add_time, update_time) VALUES (%s, 3, 10, 3600, 60, 7, 0, '', %s, %s)",
                        [(t, base, base) for t in TOPICS])
        done = 0
        while done < rows:
            n = min(ROWS_PER_INSERT, rows - done)
            values = []
            for k in range(n):
                i = done + k
                added = base + timedelta(seconds=i * 0.5)
                status = _status(rnd.random())
                effect = added + timedelta(seconds=3600 * 24 * 400) if status == "NEW" and i % 2 else added
                data = json.dumps({"order_id": i, "customer": f"c{i % 5000}", "note": "x" * (i % 40)})
                values.append((TOPICS[i % len(TOPICS)], data, status, effect, effect, 0, 1, 1,
                               f"{added:%Y-%m-%dT%H:%M:%S}.000Z PRODUCED broker=bench\n", added, added,
                               f"key-{i}" if i % 10 == 0 else None))
            row = "(" + ", ".join(["%s"] * 12) + ")"
            cur.execute(f"INSERT INTO tidemq_message ({cols}) VALUES " + ", ".join([row] * n),
                        [v for r in values for v in r])
            conn.commit()
            done += n
    conn.close()
    return time.perf_counter() - started


def measure(app, path: str, repeat: int) -> tuple[float, float]:
    client = app.test_client()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        resp = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert resp.status_code == 200, (path, resp.status_code)
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from tidemq.config import Settings
    from tidemq_admin import create_app
    from tidemq_admin.accounts import add_user
    from tidemq_broker.storages import open_storage

    server = MariaDB().start()
    try:
        url = server.create_database("tidemq_bench")
        storage = open_storage(url)
        storage.schema.create_schema()
        seconds = fill(server, "tidemq_bench", args.rows)
        print(f"inserted {args.rows:,} messages in {seconds:.1f} s ({args.rows / seconds:,.0f} rows/s)")
        server.execute("ANALYZE TABLE tidemq_message", "tidemq_bench")
        # What a running broker's maintenance leader does every ~10 s: count per topic and
        # status once and store it, so the dashboard and topics pages do not count 1M rows.
        from tidemq_broker.maintenance.counts import TopicCounts

        started = time.perf_counter()
        TopicCounts(storage.counts).run()
        print(f"the leader's count of {args.rows:,} messages took {(time.perf_counter() - started) * 1000:.0f} ms")
        app = create_app(Settings.from_env({}, db_url=url), storage=storage)
        add_user(app.extensions["tidemq"].admin, "bench", "quiet-river-stone-7", "admin")
        client = app.test_client()
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
        assert client.post("/login", data={"csrf_token": token, "name": "bench",
                                           "password": "quiet-river-stone-7"}).status_code == 302
        app.test_client = lambda: client  # type: ignore[method-assign]  # keep the signed-in session
        mid = args.rows // 2
        pages = [
            ("newest, all topics", "/messages"),
            ("deep page, all topics", f"/messages?before={mid}"),
            ("FAIL of all topics", "/messages?status=FAIL"),
            ("FAIL of all topics, deep", f"/messages?status=FAIL&before={mid}"),
            ("one topic", "/messages?topic=bench.topic3"),
            ("one topic, deep", f"/messages?topic=bench.topic3&before={mid}"),
            ("one topic + RUNNING", "/messages?topic=bench.topic3&status=RUNNING"),
            ("by id", f"/messages?id={mid}"),
            ("by unique_key, all topics", f"/messages?unique_key=key-{mid // 10 * 10}"),
            ("text in data (bounded scan)", "/messages?text=c4242"),
            ("text, no match (bounded scan)", "/messages?text=nothing-like-this"),
            ("FAIL + added range", "/messages?status=FAIL&added_from=2024-01-02&added_to=2024-01-03"),
            ("effect range, all topics", "/messages?effect_from=2024-01-03&effect_to=2024-01-04"),
            ("message detail", f"/messages/{mid}"),
            ("dashboard", "/"),
            ("topics", "/topics"),
        ]
        print(f"{'page':34} {'median ms':>10} {'worst ms':>10}")
        missed = []
        for name, path in pages:
            med, worst = measure(app, path, args.repeat)
            print(f"{name:34} {med:10.1f} {worst:10.1f}", flush=True)
            if name in ("dashboard", "topics") and med > 50:
                missed.append(f"{name} {med:.1f} ms")
        print("target dashboard and topics <= 50 ms (median): " + ("MISSED: " + ", ".join(missed) if missed else "met"))
        storage.close()
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
