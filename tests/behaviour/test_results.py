"""Results, errors, progress and cancelling running work, through what an application calls:
handles from ``produce(..., result=True)``, acks with results, heartbeats with progress and
cancel flags. Each scenario runs against the StubBroker and a real broker."""

from __future__ import annotations

import json
import threading

import pytest

from tidemq.errors import MessageCancelledError, MessageNotFoundError, RemoteError, ResultTimeoutError
from tidemq.handles import Handle
from tidemq.lifecycle import MessageStatus
from tidemq.link import AckItem, AckOutcome, LeaseRef, ProgressRef

from .scenario import CONSUMER, pull

APPLIED, STALE = [AckOutcome.APPLIED], [AckOutcome.STALE]


def test_a_handle_returns_the_stored_result_and_is_rebuilt_from_its_id(double):
    handle = double.link.produce("r", {"n": 2}, result=True)
    assert isinstance(handle, Handle) and handle.status() is MessageStatus.NEW
    [d] = pull(double, "r")
    assert handle.status() is MessageStatus.RUNNING
    item = AckItem(d.id, d.lease_token, True, result=json.dumps({"doubled": 4}))
    assert double.link.ack("r", CONSUMER, [item]) == APPLIED
    assert handle.result(timeout=5) == {"doubled": 4}
    assert Handle(handle.id, double.link).result(timeout=0) == {"doubled": 4}
    [plain] = double.link.produce_many("r", [1], result=False)
    assert isinstance(plain, int)


def test_a_waiting_handle_is_answered_by_the_ack_and_times_out_before_it(double):
    handle = double.link.produce("r", 1, result=True)
    with pytest.raises(ResultTimeoutError, match="still NEW"):
        handle.result(timeout=0.2)
    [d] = pull(double, "r")
    answer: list = []
    waiter = threading.Thread(target=lambda: answer.append(handle.result(timeout=20)))
    waiter.start()
    double.link.ack("r", CONSUMER, [AckItem(d.id, d.lease_token, True, result='"late"')])
    waiter.join(20)
    assert answer == ["late"]


def test_a_failure_reraises_as_a_remote_error_with_its_type_message_and_traceback(double):
    handle = double.link.produce("r", 1, retry=0, result=True)
    [d] = pull(double, "r")
    error = json.dumps({"type": "app.jobs.QuotaError", "message": "over quota", "traceback": "Traceback ..."})
    double.link.ack("r", CONSUMER, [AckItem(d.id, d.lease_token, False, "QuotaError: over quota", error)])
    with pytest.raises(RemoteError) as info:
        handle.result(timeout=5)
    assert (info.value.type, info.value.message, info.value.traceback) == \
        ("app.jobs.QuotaError", "over quota", "Traceback ...")


def test_progress_and_a_cancel_request_travel_with_heartbeats_and_a_late_ack_cannot_revive_it(double):
    handle = double.link.produce("r", 1, result=True)
    [d] = pull(double, "r", ttr=30)
    lease = LeaseRef(d.id, d.lease_token)
    beat = double.link.heartbeat([lease], 30, CONSUMER, [ProgressRef(d.id, d.lease_token, 3, 10, "rows")])
    assert (beat.extended, beat.cancel_requested) == ([True], [False])
    progress = handle.progress()
    assert (progress.done, progress.total, progress.note) == (3, 10, "rows") and progress.at > 0
    assert handle.cancel(running=True) is True
    assert handle.status() is MessageStatus.RUNNING
    assert double.link.heartbeat([lease], 30, CONSUMER).cancel_requested == [True]
    stop = AckItem(d.id, d.lease_token, False, "cancelled", cancelled=True)
    assert double.link.ack("r", CONSUMER, [stop]) == APPLIED
    with pytest.raises(MessageCancelledError):
        handle.result(timeout=5)
    assert double.link.ack("r", CONSUMER, [AckItem(d.id, d.lease_token, True, result="1")]) == STALE
    assert double.stored(handle.id).status == "CANCELLED"
    assert handle.cancel(running=True) is False


def test_a_cancel_requested_message_whose_worker_died_ends_cancelled_and_never_runs_again(double):
    handle = double.link.produce("r", 1, result=True)
    [d] = pull(double, "r", ttr=1)
    handle.cancel(running=True)
    double.run_out_leases([d.id])
    assert handle.status() is MessageStatus.CANCELLED
    assert pull(double, "r") == []
    assert double.stored(handle.id).events[-2:] == ("CANCEL_REQUESTED", "CANCELLED")


def test_a_result_read_for_an_unknown_id_names_it(double):
    with pytest.raises(MessageNotFoundError, match="message 987654 is not stored"):
        Handle(987654, double.link).status()
    with pytest.raises(MessageNotFoundError):
        Handle(987654, double.link).result(timeout=1)
