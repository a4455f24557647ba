"""TIDEMQ_LOG_FORMAT=json: one JSON object per line with the message's id, topic and trace id."""

from __future__ import annotations

import io
import json
import logging

import pytest
from opentelemetry import trace

from tests.otel import exporter
from tidemq import Settings
from tidemq.errors import ConfigurationError
from tidemq.logs import JsonFormatter, configure_logging, message_context


def _line(logger_name="tidemq.test", level=logging.INFO, message="ran %s", args=("it",), exc_info=None,
          **extra) -> dict:
    logger = logging.getLogger(logger_name)
    record = logger.makeRecord(logger_name, level, "f.py", 1, message, args, exc_info, extra=extra or None)
    text = JsonFormatter().format(record)
    assert "\n" not in text
    return json.loads(text)


def test_a_line_has_time_level_logger_and_message():
    line = _line()
    assert set(line) == {"time", "level", "logger", "message"}
    assert (line["level"], line["logger"], line["message"]) == ("INFO", "tidemq.test", "ran it")
    assert line["time"].endswith("Z") and "T" in line["time"]


def test_extra_names_the_message():
    line = _line(tidemq_message_id=42, tidemq_topic="orders")
    assert (line["message_id"], line["topic"]) == (42, "orders")


def test_a_message_context_names_the_message_and_its_trace():
    with message_context(7, "sms.send", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"):
        line = _line()
    assert (line["message_id"], line["topic"], line["trace_id"]) == (7, "sms.send", "0af7651916cd43dd8448eb211c80319c")
    assert "message_id" not in _line()  # only inside the block


def test_the_current_span_gives_the_trace_id():
    exporter()
    with trace.get_tracer("test").start_as_current_span("work") as span:
        line = _line()
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")


def test_exceptions_and_newlines_stay_on_one_line():
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        import sys

        line = _line(level=logging.ERROR, message="failed:\n%s", args=("two\nlines",), exc_info=sys.exc_info())
    assert line["message"] == "failed:\ntwo\nlines"
    assert "ValueError: bad" in line["exception"]


def test_the_setting_is_read_and_checked():
    assert Settings.from_env({}).log_format == "text"
    assert Settings.from_env({"TIDEMQ_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(ConfigurationError, match="TIDEMQ_LOG_FORMAT must be one of text, json"):
        Settings.from_env({"TIDEMQ_LOG_FORMAT": "xml"})


def test_configure_logging_writes_json_to_its_stream(monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root.handlers[:] = []
    try:
        configure_logging("json")
        configure_logging("json")  # again: still one handler of ours
        assert len(root.handlers) == 1
        logging.getLogger("tidemq.x").info("hello %d", 5)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    [line] = stream.getvalue().splitlines()
    assert json.loads(line)["message"] == "hello 5"
