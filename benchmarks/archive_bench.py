"""Archive benchmark: ``python -m benchmarks.archive_bench [--messages N] [--million]``.

Seeds N finished messages in a throwaway MariaDB, then in the same run and the same Spark
session measures (1) a plain JDBC -> Parquet copy of the table, the baseline, and (2) the
archive job (read, write partitioned by topic/day, verify counts, delete from MySQL). Prints
rows/s of both and their ratio; the archive's counts are checked exactly (every id in Parquet
once, none left in MySQL). ``--kill`` also kills an archive process with SIGKILL in the middle
of a batch, reruns it and checks the counts again.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

from tests.servers import MariaDB, wait_until

__all__ = ["seed_finished", "main"]

TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]
_COLUMNS = ("topic, data, status, effect_time, order_time, retry_remaining, retry_schedule, attempt, ttr, lease_token, "
            "lease_expire, consumer, unique_key, version, trace, add_time, update_time, start_time, finish_time")


def seed_finished(conn, n: int, topics: int = 4, days: int = 3, start: str = "2024-03-01 00:00:00") -> None:
    """Insert ``n`` SUCCESS/FAIL messages (1 in 20 FAIL) spread over ``topics`` topics and
    ``days`` days, generated inside MariaDB (its SEQUENCE engine): seconds, not minutes."""
    step = max(1, days * 86_400_000 // max(n, 1))
    sql = (
        f"INSERT INTO tidemq_message ({_COLUMNS}) "
        "SELECT CONCAT('bench.t', seq % {topics}), "
        "CONCAT('{{\"n\": ', seq, ', \"pad\": \"', REPEAT('x', seq % 64), '\"}}'), "
        "IF(seq % 20 = 0, 'FAIL', 'SUCCESS'), t, t, 0, NULL, 1, 30, NULL, NULL, 'c1', NULL, 2, "
        "CONCAT(DATE_FORMAT(t, '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'), ' PRODUCED broker=b1\\n'), t, "
        "t + INTERVAL 1 SECOND, t + INTERVAL 100000 MICROSECOND, t + INTERVAL 1 SECOND "
        "FROM (SELECT seq, TIMESTAMP('{start}') + INTERVAL (seq * {step}) * 1000 MICROSECOND AS t "
        "FROM seq_1_to_{n}) s"
    ).format(topics=topics, start=start, step=step, n=n)
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.commit()


def _plain_copy(spark, db, target: str, partitions: int) -> float:
    from tidemq_pipeline.archive import read_batch

    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT MIN(id), MAX(id) FROM tidemq_message")
        low, high = cur.fetchone()
    started = time.monotonic()
    read_batch(spark, db, low, high + 1, "1 = 1", partitions).write.mode("overwrite").parquet(target)
    return time.monotonic() - started


def _check(spark, db, archive: str, n: int) -> None:
    from pyspark.sql import functions as F

    row = spark.read.parquet(archive).agg(F.count("*").alias("rows"), F.countDistinct("id").alias("ids")).collect()[0]
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM tidemq_message")
        left = cur.fetchone()[0]
    if (row["rows"], row["ids"], left) != (n, n, 0):
        raise SystemExit(f"archive counts wrong: parquet rows={row['rows']} distinct ids={row['ids']} "
                         f"mysql left={left}, expected {n}/{n}/0")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.archive_bench", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=200_000, help="finished messages to seed (default 200000)")
    p.add_argument("--million", action="store_true", help="seed 1,000,000 messages")
    p.add_argument("--batch-rows", type=int, default=250_000, help="ids per archive batch")
    p.add_argument("--partitions", type=int, default=2, help="parallel JDBC reads, in both runs")
    p.add_argument("--kill", action="store_true",
                   help="also: SIGKILL an archive process in the middle of a batch, rerun it, check the counts")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    n = 1_000_000 if args.million else args.messages
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from tidemq_broker.storages import open_storage
    from tidemq_pipeline.archive import run_archive
    from tidemq_pipeline.database import Database
    from tidemq_pipeline.session import spark_session

    server = MariaDB().start()
    work = tempfile.mkdtemp(prefix="tidemq-archive-bench-")
    try:
        url = server.create_database("bench")
        storage = open_storage(url)
        storage.schema.create_schema()
        storage.close()
        db = Database.from_url(url)
        t0 = time.monotonic()
        with db.connect() as conn:
            seed_finished(conn, n)
        seeded = time.monotonic() - t0
        spark = spark_session(f"local[{args.partitions}]", app="tidemq-archive-bench")
        plain = _plain_copy(spark, db, f"{work}/plain", args.partitions)
        summary = run_archive(spark, db, f"{work}/archive", args.batch_rows, args.partitions)
        archive_s = summary.seconds
        _check(spark, db, f"{work}/archive", n)
        result = {"messages": n, "seed_s": round(seeded, 2), "plain_copy_s": round(plain, 2),
                  "plain_rows_per_s": round(n / plain), "archive_s": round(archive_s, 2),
                  "archive_rows_per_s": round(n / archive_s), "ratio": round(plain / archive_s, 3),
                  "archive_summary": summary.line()}
        if args.kill:
            result.update(_kill_and_rerun(spark, db, url, n, work, args))
        spark.stop()
    finally:
        server.cleanup()
    print(f"archive of {n} finished messages: {result['archive_rows_per_s']} rows/s ({result['archive_s']} s); "
          f"plain JDBC->Parquet copy: {result['plain_rows_per_s']} rows/s ({result['plain_copy_s']} s); "
          f"ratio {result['ratio']} (target >= 0.5)")
    if "killed_at_s" in result:
        print(f"killed -9 after {result['killed_at_s']} s ({result['batches_done_at_kill']} batch(es) done), "
              f"rerun took {result['rerun_s']} s; counts exact")
    if args.json:
        print(json.dumps(result))
    return 0


def _kill_and_rerun(spark, db, url: str, n: int, work: str, args) -> dict:
    with db.connect() as conn:
        seed_finished(conn, n)
        with conn.cursor() as cur:
            cur.execute("DELETE FROM tidemq_archive_batch")
    archive = f"{work}/archive-killed"
    cmd = TIDEMQ + ["--db-url", url, "pipeline", "archive", "--master", f"local[{args.partitions}]",
                    "--archive", archive, "--batch-rows", str(max(1, n // 5)), "--partitions", str(args.partitions)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()

    def mid_batch() -> bool:  # one batch done, the next one being written
        if proc.poll() is not None:
            raise SystemExit(f"the archive process ended (rc {proc.returncode}) before it could be killed mid-batch")
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT state, COUNT(*) FROM tidemq_archive_batch GROUP BY state")
            states = dict(cur.fetchall())
        return states.get("DONE", 0) >= 1 and states.get("PENDING", 0) == 1

    wait_until(mid_batch, 600, 0.05, "an archive batch in the middle of its write")
    killed_at = time.monotonic() - started
    proc.kill()
    proc.wait()
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM tidemq_archive_batch WHERE state = 'DONE'")
        done = cur.fetchone()[0]
    started = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rerun = time.monotonic() - started
    _check(spark, db, archive, n)
    return {"killed_at_s": round(killed_at, 1), "batches_done_at_kill": done, "rerun_s": round(rerun, 2)}


if __name__ == "__main__":
    sys.exit(main())
