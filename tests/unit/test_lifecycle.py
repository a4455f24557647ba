"""The lifecycle module owns the state machine: each transition's guard, target, values and
trace line, and the only spelling of the status names in the product's code."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional

import pytest

from tidemq import clock, lifecycle, trace
from tidemq.lifecycle import EDITABLE_STATUSES, Event, MessageStatus as S
from tidemq.tables import MESSAGE as M

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 2, 3, 4, 5, 6000)


@dataclass
class _Msg:
    retry_remaining: int
    attempt: int = 1
    retry_schedule: Optional[list[float]] = None


@dataclass
class _Backoff:
    retry_base: float = 10.0
    retry_max: float = 3600.0


def _events(change: lifecycle.Change) -> list[str]:
    return [entry["event"] for entry in trace.parse(change.trace)]


def test_status_names_are_spelled_in_the_lifecycle_module_only():
    literal = re.compile(r"""["'](NEW|RUNNING|SUCCESS|FAIL)["']""")
    checked, found = 0, []
    for folder in ("client", "broker", "admin_web", "pipeline", "cli", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".html", ".js") or path.name == "lifecycle.py":
                continue
            checked += 1
            found += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                      if literal.search(line)]
    assert checked > 80
    assert not found, "status names spelled outside tidemq/lifecycle.py:\n" + "\n".join(found)


def test_lease_moves_new_to_running_counts_the_delivery_and_names_the_consumer():
    change = lifecycle.lease(NOW, 30, "worker-1", "a" * 32, broker="b:1", rank="0/2")
    assert (change.source, change.target, change.attempt_delta) == ((S.NEW,), S.RUNNING, 1)
    assert (change.values[M.lease_token] == "a" * 32
            and change.values[M.lease_expire] == datetime(2026, 1, 2, 3, 4, 35, 6000))
    [entry] = trace.parse(change.trace)
    assert (entry["event"], entry["consumer"], entry["rank"], entry["ttr"]) == ("LOCKED", "worker-1", "0/2", "30")


def test_a_failure_retries_while_retries_remain_by_schedule_then_fails():
    retry = lifecycle.fail_attempt(_Msg(2, retry_schedule=[5.0, 60.0]), _Backoff(), "boom", NOW, "c", "b")
    assert (retry.source, retry.target, retry.event) == ((S.RUNNING,), S.NEW, Event.RETRY)
    assert retry.values[M.retry_remaining] == 1 and retry.values[M.lease_expire] is None
    assert retry.values[M.effect_time] == datetime(2026, 1, 2, 3, 4, 10, 6000)  # schedule entry 0: 5 s
    final = lifecycle.fail_attempt(_Msg(0, attempt=3), _Backoff(), "", NOW, "c", "b")
    assert (final.target, final.values[M.finish_time]) == (S.FAIL, NOW)
    assert trace.parse(final.trace)[0]["error"] == "failed"


@pytest.mark.parametrize("retry_remaining", [0, 1, 5])
def test_the_worker_decides_a_runs_outcome_by_the_rule_the_broker_applies_to_its_ack(retry_remaining):
    change = lifecycle.fail_attempt(_Msg(retry_remaining), _Backoff(), "boom", NOW, "c", "b")
    outcome = lifecycle.handler_outcome(True, retry_remaining)
    assert outcome is {Event.RETRY: lifecycle.HandlerOutcome.RETRY,
                       Event.FAIL: lifecycle.HandlerOutcome.FAIL}[change.event]
    assert lifecycle.handler_outcome(False, retry_remaining) is lifecycle.HandlerOutcome.SUCCESS


def test_backoff_grows_exponentially_with_jitter_and_a_ceiling():
    rng = random.Random(7)
    delays = [lifecycle.next_delay(_Msg(5, attempt=a), _Backoff(10, 100), rng) for a in (1, 2, 3, 4, 5, 6)]
    for delay, ceiling in zip(delays, (10, 20, 40, 80, 100, 100)):
        assert ceiling * 0.5 <= delay <= ceiling


def test_release_gives_the_delivery_back_and_clears_the_lease():
    change = lifecycle.release(NOW, "c", "b")
    assert (change.source, change.target, change.attempt_delta) == ((S.RUNNING,), S.NEW, -1)
    assert change.values[M.lease_token] is None and change.values[M.lease_expire] is None


def test_an_extension_moves_only_the_lease_and_leaves_no_trace():
    change = lifecycle.extend(NOW, 90)
    assert (change.source, change.target, change.trace, change.bump_version) == ((S.RUNNING,), S.RUNNING, "", False)
    assert set(change.values) == {M.lease_expire, M.ttr}


@pytest.mark.parametrize("deliveries, limit, target", [(1, 10, S.NEW), (9, 10, S.NEW), (10, 10, S.FAIL),
                                                        (12, 10, S.FAIL), (50, 0, S.NEW)])
def test_an_expired_lease_returns_the_message_until_max_deliveries(deliveries, limit, target):
    change = lifecycle.expire(NOW, deliveries, limit, "worker-9", "b", expiries=4)
    assert (change.source, change.target) == ((S.RUNNING,), target)
    [entry] = trace.parse(change.trace)
    assert entry["lost_by"] == "worker-9"
    if target is S.FAIL:
        assert entry["error"] == f"lease_expired_4_times:_max_deliveries_{limit}_reached"
        assert change.values[M.finish_time] == NOW
    else:
        assert entry["event"] == "LEASE_EXPIRED"


def test_operators_changes_never_touch_a_running_message():
    edit = lifecycle.admin_edit(NOW, "ann", S.NEW, ["status"], {M.data: "1"})
    assert S.RUNNING not in edit.source and edit.target is S.NEW and edit.values[M.finish_time] is None
    assert trace.parse(edit.trace)[0]["user"] == "ann"
    keep = lifecycle.admin_edit(NOW, "ann", None, ["data"], {M.data: "2"})
    assert keep.target is None and not keep.delete and M.finish_time not in keep.values
    with pytest.raises(ValueError, match="status must be one of NEW, SUCCESS, FAIL"):
        lifecycle.admin_edit(NOW, "ann", S.RUNNING, ["status"])
    assert S.RUNNING not in EDITABLE_STATUSES
    delete = lifecycle.admin_delete()
    assert delete.delete and S.RUNNING not in delete.source


def test_cancel_requeue_retire_and_restore():
    assert lifecycle.cancel().delete and lifecycle.cancel().source == (S.NEW, S.WAITING)
    requeue = lifecycle.requeue(NOW, 2, Event.ADMIN_RETRY, user="ann")
    assert (requeue.source, requeue.target, requeue.values[M.retry_remaining]) == ((S.FAIL,), S.NEW, 2)
    assert _events(requeue) == ["ADMIN_RETRY"]
    assert lifecycle.retire().delete and lifecycle.retire().source == (S.SUCCESS,)
    restore = lifecycle.restore(NOW, 1, job="restore")
    assert restore.values[M.status] == "NEW" and set(restore.source) == {S.SUCCESS, S.FAIL, S.CANCELLED}
    assert restore.values[M.result] is None and restore.values[M.cancel_requested] is False


@pytest.mark.parametrize("days, archive, broker_deletes", [(7, False, True), (0, False, False), (7, True, False)])
def test_the_retention_rule_says_who_removes_successes(days, archive, broker_deletes):
    assert lifecycle.retention_deletes_success(days, archive) is broker_deletes


def test_a_change_applies_to_a_row_in_memory_as_to_a_stored_one():
    from tidemq.tables import MESSAGE as M

    now = clock.now()
    row = {M.status: "NEW", M.attempt: 0, M.version: 0, M.trace: "t0\n"}
    change = lifecycle.lease(now, 30, "c1", "tok")
    assert change.allows(row)
    change.apply_to(row)
    assert row[M.status] == "RUNNING" and row[M.attempt] == 1 and row[M.version] == 1
    assert row[M.lease_token] == "tok" and row[M.trace].startswith("t0\n") and "LOCKED" in row[M.trace]
    assert not lifecycle.lease(now, 30, "c2", "other").allows(row)  # only NEW may be leased
    extend = lifecycle.extend(now, 60)
    extend.apply_to(row)
    assert row[M.version] == 1  # a heartbeat moves no version


def test_a_topic_never_configured_has_the_lifecycles_defaults_in_the_broker_and_the_stub():
    from tidemq.stub import StubTopic
    from tidemq_broker.storage import TopicSettings

    want = (lifecycle.DEFAULT_RETRY_COUNT, lifecycle.DEFAULT_RETRY_BASE, lifecycle.DEFAULT_RETRY_MAX,
            lifecycle.DEFAULT_TTR, lifecycle.DEFAULT_MAX_DELIVERIES)
    for settings in (TopicSettings("t"), StubTopic()):
        assert (settings.retry_count, settings.retry_base, settings.retry_max, settings.ttr,
                settings.max_deliveries) == want


def test_expiries_are_counted_from_the_trace_for_a_poison_messages_fail_line():
    lost = lifecycle.lease_lost(NOW, "c1", "b").trace + lifecycle.lease(NOW, 30, "c2", "a" * 32).trace
    assert lifecycle.lease_expiries("") == 0
    assert lifecycle.lease_expiries(lost * 2) == 2
    change = lifecycle.expire(NOW, 3, 3, "c2", "b", lifecycle.lease_expiries(lost * 2) + 1)
    assert trace.parse(change.trace)[0]["error"] == "lease_expired_3_times:_max_deliveries_3_reached"


def test_success_stores_the_result_with_the_status_and_keeps_the_lease_token():
    change = lifecycle.succeed(NOW, "c", "b", result='{"rows": 3}')
    assert (change.source, change.target, change.values[M.result]) == ((S.RUNNING,), S.SUCCESS, '{"rows": 3}')
    assert M.lease_token not in change.values and change.values[M.lease_expire] is None
    assert lifecycle.succeed(NOW, "c", "b").values[M.result] is None


@pytest.mark.parametrize("retry_remaining, target", [(2, S.NEW), (0, S.FAIL)])
def test_a_failure_keeps_its_error_result_on_a_retry_and_on_fail(retry_remaining, target):
    error = '{"type": "builtins.ValueError", "message": "bad", "traceback": ""}'
    change = lifecycle.fail_attempt(_Msg(retry_remaining), _Backoff(), "bad", NOW, "c", "b", result=error)
    assert (change.target, change.values[M.result]) == (target, error)


def test_a_failure_after_a_cancel_request_ends_cancelled_not_retried():
    change = lifecycle.fail_attempt(_Msg(5), _Backoff(), "stopped", NOW, "c", "b", cancel_requested=True)
    assert (change.source, change.target, change.event) == ((S.RUNNING,), S.CANCELLED, Event.CANCELLED)
    assert change.values[M.finish_time] == NOW and M.lease_token not in change.values


def test_a_cancel_request_marks_a_running_message_and_leaves_it_running():
    change = lifecycle.request_cancel(NOW, broker="b:1")
    assert (change.source, change.target, change.values[M.cancel_requested]) == ((S.RUNNING,), S.RUNNING, True)
    assert _events(change) == ["CANCEL_REQUESTED"] and change.bump_version


def test_cancelled_is_final_keeps_the_lease_token_and_is_no_longer_editable_as_running():
    change = lifecycle.cancelled(NOW, "worker-1", "b:1")
    assert (change.source, change.target) == ((S.RUNNING,), S.CANCELLED)
    assert M.lease_token not in change.values and change.values[M.lease_expire] is None
    assert trace.parse(change.trace)[0]["consumer"] == "worker-1"
    assert S.CANCELLED in lifecycle.FINAL_STATUSES and S.CANCELLED in lifecycle.ARCHIVABLE_STATUSES
    assert S.CANCELLED in EDITABLE_STATUSES


def test_an_expired_lease_of_a_cancel_requested_message_ends_it_cancelled_whatever_its_deliveries():
    for deliveries in (1, 10):
        change = lifecycle.expire(NOW, deliveries, 10, "worker-9", "b", cancel_requested=True)
        assert change.target is S.CANCELLED
        assert trace.parse(change.trace)[0]["error"] == "lease_expired"


def test_progress_is_lease_guarded_elsewhere_and_leaves_no_trace_nor_version():
    change = lifecycle.report_progress(NOW, '{"done": 1, "total": 2, "note": "", "at": 1}')
    assert (change.source, change.target, change.trace, change.bump_version) == ((S.RUNNING,), S.RUNNING, "", False)
    assert set(change.values) == {M.progress}
    row = {M.status: "RUNNING", M.version: 4, M.trace: "t", M.attempt: 1}
    change.apply_to(row)
    assert row[M.version] == 4 and row[M.trace] == "t"


def test_forget_result_clears_result_and_progress_of_finished_messages_only():
    change = lifecycle.forget_result(NOW)
    assert set(change.source) == {S.SUCCESS, S.FAIL, S.CANCELLED} and change.target is None
    assert change.values == {M.result: None, M.progress: None} and not change.delete


def test_paths_back_to_new_clear_a_cancel_request():
    assert lifecycle.requeue(NOW, 1).values[M.cancel_requested] is False
    assert lifecycle.admin_edit(NOW, "ann", S.NEW, ["status"]).values[M.cancel_requested] is False
    assert lifecycle.produce(NOW).values[M.cancel_requested] is False
