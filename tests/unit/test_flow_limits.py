"""Operators' flow limits (CLI, console) are checked with the limit named; the producer's key
and priority likewise; the rate's bucket refills at the rate, starts with a tenth of a second's
worth and keeps up to a second's worth while leases keep coming."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tidemq.errors import MalformedRequestError, ValidationError
from tidemq.validation import check_flow_key, check_priority
from tidemq_broker.flow import check_limits, parse_limit
from tidemq_broker.storage import FlowLimits
from tidemq_broker.flow import refill


def test_limits_in_range_pass_and_out_of_range_name_the_limit():
    assert check_limits(5, 2, None) == FlowLimits(5, 2.0, None)
    for args, message in (((0, None, None), "max_running must be a whole number from 1 to 1000000"),
                          ((None, None, True), "max_running_per_key must be a whole number"),
                          ((None, 0.0, None), "rate_per_second must be above 0 and at most 1000000"),
                          ((None, float("inf"), None), "rate_per_second must be above 0")):
        with pytest.raises(ValidationError, match=message):
            check_limits(*args)


def test_parse_limit_takes_numbers_or_none():
    assert parse_limit("none") is None and parse_limit(" ") is None
    assert parse_limit("12") == 12 and parse_limit("0.5", float) == 0.5
    with pytest.raises(ValidationError, match="whole number or 'none'"):
        parse_limit("1.5")


def test_key_and_priority_checks_name_their_limits():
    assert check_flow_key(None) == "" and check_flow_key("customer-42") == "customer-42"
    with pytest.raises(MalformedRequestError, match="key is 256 characters long; the limit is 255"):
        check_flow_key("k" * 256)
    assert check_priority(9) == 9
    for bad in (-1, 10, True, 1.5, "3"):
        with pytest.raises(MalformedRequestError, match="priority must be a whole number from 0 to 9"):
            check_priority(bad)


def test_bucket_refills_at_the_rate_up_to_a_tenth_of_a_second():
    at = datetime(2030, 1, 1)
    assert refill(None, None, 100, at) == 10  # a new bucket starts full
    assert refill(0.0, at, 100, at + timedelta(seconds=0.05)) == pytest.approx(5)
    assert refill(0.0, at, 100, at + timedelta(seconds=5)) == 10
    assert refill(0.5, at, 2, at + timedelta(seconds=0.25)) == 1  # at least one token
    assert refill(0.5, at, 2, at - timedelta(seconds=3)) == 0.5  # a clock that went back adds nothing
    # A late pull (0.6 s after the last lease) catches up what accrued, up to a second's worth ...
    assert refill(0.0, at, 100, at + timedelta(seconds=0.6)) == pytest.approx(60)
    assert refill(30.0, at, 100, at + timedelta(seconds=0.9)) == 100
    # ... but after more than a second without a lease the topic was idle: a small burst only.
    assert refill(0.0, at, 100, at + timedelta(seconds=1.2)) == 10
