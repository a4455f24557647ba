"""Generated message rows with known answers, inserted with plain PyMySQL."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any, Optional

from tidemq.tables import MESSAGE

COLUMNS = MESSAGE.columns()
BASE = datetime(2024, 3, 1, 0, 0, 0)


def _ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _line(at: datetime, event: str, **fields: Any) -> str:
    text = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z {event}"
    return text + "".join(f" {k}={v}" for k, v in fields.items()) + "\n"


def message_rows(n: int, topics: tuple[str, ...] = ("t.alpha", "t.beta"), seed: int = 7, start_id: int = 1,
                 base: datetime = BASE, hours: int = 6, statuses: Optional[tuple[str, ...]] = None) -> list[dict]:
    """``n`` messages spread over ``hours`` hours from ``base``, in every state, with retries and
    lease expiries in their traces, ms-precise times and random delays."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        topic = rnd.choice(topics)
        add = _ms(base + timedelta(seconds=rnd.uniform(0, hours * 3600)))
        order = _ms(add + timedelta(seconds=rnd.choice([0, 0, rnd.uniform(0, 5400)])))
        status = rnd.choice(statuses or ("SUCCESS", "SUCCESS", "SUCCESS", "FAIL", "NEW", "RUNNING"))
        trace = _line(add, "PRODUCED", broker="b1")
        effect, moment, attempt = order, order, 1
        for _ in range(rnd.choice([0, 0, 1, 2])):
            moment = _ms(moment + timedelta(seconds=rnd.uniform(1, 900)))
            if rnd.random() < 0.3:
                trace += _line(moment, "LEASE_EXPIRED", broker="b1", lost_by="c9")
            else:
                trace += _line(moment, "RETRY", consumer="c1", attempt=attempt, error="boom")
                attempt += 1
            effect = _ms(moment + timedelta(seconds=rnd.uniform(0, 60)))
            moment = effect
        start = finish = None
        if status != "NEW":
            start = _ms(effect + timedelta(milliseconds=rnd.uniform(0, 3000)))
            trace += _line(start, "LOCKED", consumer="c1")
        if status in ("SUCCESS", "FAIL"):
            finish = _ms(start + timedelta(milliseconds=rnd.uniform(1, 20000)))
            trace += _line(finish, status, consumer="c1")
        if status == "NEW" and rnd.random() < 0.5:
            effect = order = _ms(base + timedelta(days=3650))  # delayed far ahead: not backlog
        rows.append({
            "id": start_id + i, "topic": topic, "data": f'{{"n": {i}, "pad": "{"x" * rnd.randint(0, 40)}"}}',
            "status": status, "effect_time": effect, "order_time": order, "retry_remaining": rnd.randint(0, 3),
            "retry_schedule": None if i % 3 else "[1, 2]", "attempt": attempt, "ttr": 30,
            "lease_token": "tok" if status == "RUNNING" else None,
            "lease_expire": _ms(start + timedelta(seconds=30)) if status == "RUNNING" else None,
            "consumer": "c1" if start else None, "unique_key": f"k-{i}" if i % 5 == 0 else None, "version": attempt,
            "trace": trace, "add_time": add, "update_time": finish or start or add, "start_time": start,
            "finish_time": finish,
            "trace_context": f"00-{i:032x}-{i + 1:016x}-01" if i % 2 else None,
            "priority": i % 10, "flow_key": f"customer-{i % 7}" if i % 4 == 0 else None,
            # Results (version 11): the archive carries them with every other column.
            "result": f'{{"n": {i}}}' if status == "SUCCESS" and i % 2 else None,
            "progress": f'{{"done": {i}, "total": null, "note": "", "at": 1}}' if status == "RUNNING" else None,
            "cancel_requested": 0,
            # Dependencies (version 12): none here; the archive carries the columns all the same.
            "deps_left": 0, "workflow_id": None, "wait_mode": 0, "deps_failed": 0,
        })
    return rows


def insert_rows(db, rows: list[dict], chunk: int = 2000) -> None:
    conn = db.connect()
    try:
        sql = (f"INSERT INTO tidemq_message ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})")
        with conn.cursor() as cur:
            for at in range(0, len(rows), chunk):
                cur.executemany(sql, [tuple(r[c] for c in COLUMNS) for r in rows[at:at + chunk]])
    finally:
        conn.close()


def query(db, sql: str, args: tuple = ()) -> list[tuple]:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def set_topic(db, name: str, retention_days: int = 7, alarm_backlog=None, alarm_failure_rate=None,
              alarm_due_age=None) -> None:
    now = datetime.utcnow()
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "REPLACE INTO tidemq_topic (name, retry_count, retry_base, retry_max, ttr, retention_days,"
                " max_data_bytes, paused, alarm_backlog, alarm_failure_rate, alarm_due_age, description,"
                " add_time, update_time)"
                " VALUES (%s, 3, 10, 3600, 60, %s, NULL, 0, %s, %s, %s, '', %s, %s)",
                (name, retention_days, alarm_backlog, alarm_failure_rate, alarm_due_age, now, now))
    finally:
        conn.close()
