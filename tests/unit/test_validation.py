"""Input checks: each bad input raises its own error class naming the limit or expected form."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from tidemq.errors import (
    DataTooLargeError,
    InvalidDataError,
    InvalidDelayError,
    InvalidMessageTypeError,
    InvalidRetryError,
    InvalidTopicError,
    MalformedRequestError,
    ValidationError,
)
from tidemq.message import MessageType
from tidemq.validation import (
    MAX_DELAY_SECONDS,
    check_batch_size,
    check_delay,
    check_effect_time,
    check_topic,
    check_unique_key,
    encode_data,
    parse_duration,
    parse_retry,
)


@pytest.mark.parametrize("topic", ["a", "order.close", "A-Z_0:9.x", "x" * 255])
def test_valid_topics_pass(topic):
    assert check_topic(topic) == topic


@pytest.mark.parametrize("topic, words", [
    ("", "non-empty"), (None, "non-empty"), (42, "non-empty"),
    ("x" * 256, "limit is 255"), ("has space", "[A-Za-z0-9._:-]"), ("slash/no", "[A-Za-z0-9._:-]"),
    ("ünïcode", "[A-Za-z0-9._:-]"),
])
def test_invalid_topics_name_the_rule(topic, words):
    with pytest.raises(InvalidTopicError, match=f".*{words.replace('[', '.').replace(']', '.')}"):
        check_topic(topic)


def test_data_must_be_json_and_within_the_limit():
    assert encode_data({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    with pytest.raises(InvalidDataError, match="JSON-serialisable"):
        encode_data({"when": datetime.now()})
    with pytest.raises(InvalidDataError):
        encode_data(math.nan)
    with pytest.raises(DataTooLargeError, match="limit is 100 bytes"):
        encode_data("x" * 200, max_bytes=100)
    assert encode_data("éééé", max_bytes=10) == '"éééé"'  # 6 characters, 10 bytes in UTF-8
    with pytest.raises(DataTooLargeError, match="data is 10 bytes as JSON; the limit is 9 bytes"):
        encode_data("éééé", max_bytes=9)


@pytest.mark.parametrize("delay", [0, 0.001, 1800, MAX_DELAY_SECONDS, timedelta(days=365)])
def test_delays_up_to_ten_years_pass(delay):
    check_delay(delay)


@pytest.mark.parametrize("delay, words", [
    (-1, "between 0"), (MAX_DELAY_SECONDS + 1, "10 years"), (math.inf, "between 0"), (math.nan, "between 0"),
    ("5", "number of seconds"), (True, "number of seconds"),
])
def test_bad_delays_are_refused(delay, words):
    with pytest.raises(InvalidDelayError, match=words):
        check_delay(delay)


def test_effect_time_is_converted_to_utc_and_bounded():
    aware = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert check_effect_time(aware) == datetime(2030, 1, 1, 10, tzinfo=timezone.utc)
    with pytest.raises(InvalidDelayError, match="10 years"):
        check_effect_time(datetime.now(timezone.utc) + timedelta(days=3700))
    with pytest.raises(InvalidDelayError, match="datetime"):
        check_effect_time("tomorrow")


def test_retry_counts_and_schedules():
    assert parse_retry(None) == (-1, None)
    assert parse_retry(3) == (3, None)
    assert parse_retry([0, 0, "2m", "10m", "1h", "500ms", 2.5, "1d"]) == (
        8, [0.0, 0.0, 120.0, 600.0, 3600.0, 0.5, 2.5, 86400.0])
    with pytest.raises(InvalidRetryError, match="between 0 and 1000"):
        parse_retry(-2)
    with pytest.raises(InvalidRetryError, match="'2 minutes'"):
        parse_retry(["2 minutes"])
    with pytest.raises(InvalidRetryError):
        parse_duration(-5)
    with pytest.raises(InvalidRetryError):
        parse_retry("3")


def test_message_type_parse():
    assert MessageType.parse("queue") is MessageType.QUEUE
    assert MessageType.parse(MessageType.TOPIC) is MessageType.TOPIC
    with pytest.raises(InvalidMessageTypeError, match="QUEUE, SERIAL_QUEUE, TOPIC"):
        MessageType.parse("FANOUT")


def test_unique_keys_and_batches():
    assert check_unique_key(None) == ""
    with pytest.raises(MalformedRequestError, match="limit is 255"):
        check_unique_key("k" * 256)
    with pytest.raises(MalformedRequestError, match="at least one"):
        check_batch_size([])
    with pytest.raises(MalformedRequestError, match="limit is 10000"):
        check_batch_size([0] * 10001)


def test_every_input_error_is_a_value_error():
    assert issubclass(InvalidTopicError, ValidationError) and issubclass(ValidationError, ValueError)


LONG = "x" * 10_000


def _echoing_checks():
    """Every check that quotes the value it refuses, each given a 10,000-character one."""
    from tidemq.config import Settings
    from tidemq.tracing import check_traceparent
    from tidemq.validation import check_priority
    from tidemq_admin.accounts import check_user
    from tidemq_broker import auth, flow, schedules
    from tidemq_broker.intake import check_lease_token, check_request_id

    return {
        "topic (not a string)": lambda: check_topic([LONG]),
        "topic (characters)": lambda: check_topic("a b" * 80),
        "delay": lambda: check_delay(LONG),
        "effect_time": lambda: check_effect_time(LONG),
        "retry delay": lambda: parse_duration(LONG),
        "retry": lambda: parse_retry({LONG: 1}),
        "priority": lambda: check_priority(LONG),
        "message type": lambda: MessageType.parse(LONG),
        "traceparent": lambda: check_traceparent(LONG),
        "request_id": lambda: check_request_id(LONG),
        "lease_token": lambda: check_lease_token(LONG),
        "schedule name": lambda: schedules.check_schedule(LONG, "t", "* * * * *"),
        "schedule cron": lambda: schedules.check_schedule("s", "t", LONG),
        "schedule cron fields": lambda: schedules.check_cron("x " * 5),
        "schedule timezone": lambda: schedules.check_schedule("s", "t", "* * * * *", timezone_name=LONG),
        "schedule missed": lambda: schedules.check_schedule("s", "t", "* * * * *", missed=LONG),
        "schedule retry": lambda: schedules.check_schedule("s", "t", "* * * * *", retry=LONG),
        "principal name": lambda: auth.check_name(LONG),
        "principal role": lambda: auth.check_role(LONG),
        "topic pattern": lambda: auth.parse_patterns("a b" * 80),
        "flow limit": lambda: flow.check_limits(LONG, None, None),
        "flow rate": lambda: flow.check_limits(None, LONG, None),
        "flow limit as typed": lambda: flow.parse_limit(LONG),
        "console role": lambda: check_user("ops", "correct-horse-9", LONG),
        "TIDEMQ_ZK_ROOT": lambda: Settings(zk_root=LONG).check(),
        "TIDEMQ_AUTH": lambda: Settings(auth=LONG).check(),
    }


@pytest.mark.parametrize("name", list(_echoing_checks()))
def test_an_error_quotes_only_the_start_of_a_long_value(name):
    from tidemq.errors import TidemqError

    with pytest.raises((TidemqError, ValueError)) as info:
        _echoing_checks()[name]()
    text = str(info.value)
    assert len(text) < 400, f"{name}: {len(text)} characters"
    assert "x" * 61 not in text  # at most QUOTE_CHARS of the value itself


def test_quote_cuts_long_values_and_says_how_long_they_were():
    from tidemq.errors import QUOTE_CHARS, quote

    assert quote("abc") == "'abc'" and quote(2.5) == "2.5" and quote(None) == "None"
    assert quote(LONG) == repr("x" * QUOTE_CHARS) + "... (10,000 characters)"
    assert quote(b"y" * 100).endswith("... (100 bytes)")
    assert len(quote(list(range(100_000)))) < 2 * QUOTE_CHARS + 4
    assert len(quote({"k": [LONG] * 50})) < 2 * QUOTE_CHARS + 4

    class Loud:
        def __repr__(self) -> str:
            return "!" * 100_000

    assert len(quote(Loud())) < 2 * QUOTE_CHARS + 4
