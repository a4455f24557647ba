"""Reading the console's forms: every bad field gets a message naming the expected form."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from tidemq.errors import InvalidTopicError, ValidationError
from tidemq.lifecycle import EDITABLE_STATUSES, STATUSES, MessageStatus
from tidemq.validation import (
    MAX_DELAY_SECONDS,
    MAX_RETRIES,
    UNIQUE_KEY_MAX_LENGTH,
    check_data_text,
    check_topic,
)
from tidemq_broker.flow import MAX_RATE, MAX_RUNNING_LIMIT
from tidemq_broker.schedules import check_cron, check_schedule, check_timezone
from tidemq_broker.storage import MessageEdit, MessageFilter, TopicSettings

__all__ = ["Parsed", "MAX_DELIVERIES", "MAX_ID", "whole_number", "parse_filter", "parse_edit", "parse_produce",
           "parse_topic", "parse_schedule", "parse_time", "filter_args", "parse_ids"]

#: The most deliveries a topic may allow before an expiring lease fails a message: beyond it a
#: poison message would keep killing consumers for days.
MAX_DELIVERIES = 1000
_TIME_FORMS = ("%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S.%f",
               "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d")
FILTER_FIELDS = ("topic", "status", "id", "unique_key", "effect_from", "effect_to", "added_from", "added_to", "text")


@dataclass
class Parsed:
    """A parsed form: ``value`` when ``errors`` is empty, else field name -> message."""

    value: Any = None
    errors: dict[str, str] = field(default_factory=dict)


def parse_time(text: str) -> datetime:
    """A UTC time as typed (``2024-05-01T12:00``, seconds and milliseconds optional)."""
    text = text.strip().rstrip("Z")
    for form in _TIME_FORMS:
        try:
            return datetime.strptime(text, form)
        except ValueError:
            continue
    raise ValueError("expected a UTC time like 2024-05-01T12:00:00")


def _int(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be a whole number") from None
    if not low <= value <= high:
        raise ValueError(f"{what} must be between {low} and {high}")
    return value


def _status(text: str, allowed: tuple[MessageStatus, ...]) -> MessageStatus:
    """``text`` as one of the ``allowed`` states, or ValueError listing them."""
    if text not in {s.value for s in allowed}:
        raise ValueError(f"status must be one of {', '.join(s.value for s in allowed)}")
    return MessageStatus(text)


def _float(text: str, low: float, high: float, what: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be a number") from None
    if not low <= value <= high:
        raise ValueError(f"{what} must be between {low:g} and {high:g}")
    return value


def parse_filter(args: Mapping[str, str]) -> Parsed:
    """The message list's filter from query arguments."""
    out = Parsed(MessageFilter())
    flt: MessageFilter = out.value
    for name in FILTER_FIELDS:
        raw = (args.get(name) or "").strip()
        if not raw:
            continue
        try:
            if name == "topic":
                flt.topic = check_topic(raw)
            elif name == "status":
                flt.status = _status(raw, STATUSES).value
            elif name == "id":
                flt.id = _int(raw, 1, MAX_ID, "id")
            elif name == "unique_key":
                if len(raw) > UNIQUE_KEY_MAX_LENGTH:
                    raise ValueError(f"unique key is at most {UNIQUE_KEY_MAX_LENGTH} characters")
                flt.unique_key = raw
            elif name == "text":
                if len(raw) > 200:
                    raise ValueError("search text is at most 200 characters")
                flt.text = raw
            else:
                setattr(flt, name, parse_time(raw))
        except (ValueError, ValidationError) as exc:
            out.errors[name] = str(exc)
    return out


def filter_args(args: Mapping[str, str]) -> dict[str, str]:
    """The non-empty filter fields of ``args`` (to rebuild links and hidden fields)."""
    return {k: args[k].strip() for k in FILTER_FIELDS if (args.get(k) or "").strip()}


def parse_edit(form: Mapping[str, str], max_bytes: int) -> Parsed:
    """The edit form of one message: data (JSON), status, retries left, effect time."""
    out = Parsed()
    values: dict[str, Any] = {}
    try:
        values["data"] = check_data_text((form.get("data") or "").strip(), max_bytes)
    except ValidationError as exc:
        out.errors["data"] = str(exc)
    try:  # RUNNING belongs to a consumer's lease: an operator may not set it
        values["status"] = _status(form.get("status", ""), EDITABLE_STATUSES).value
    except ValueError as exc:
        out.errors["status"] = str(exc)
    try:
        values["retry_remaining"] = _int(form.get("retry_remaining", ""), 0, MAX_RETRIES, "retries left")
    except ValueError as exc:
        out.errors["retry_remaining"] = str(exc)
    try:
        effect = parse_time(form.get("effect_time", ""))
        ahead = (effect - datetime.now(timezone.utc).replace(tzinfo=None)).total_seconds()
        if ahead > MAX_DELAY_SECONDS:
            raise ValueError("effect time may be at most 10 years ahead")
        values["effect_time"] = effect.replace(microsecond=effect.microsecond // 1000 * 1000)
    except ValueError as exc:
        out.errors["effect_time"] = str(exc)
    if not out.errors:
        out.value = MessageEdit(**values)
    return out


def parse_produce(form: Mapping[str, str], max_bytes: int) -> Parsed:
    """The test-message form: topic, data, delay, retries, unique key."""
    out = Parsed()
    values: dict[str, Any] = {}
    try:
        values["topic"] = check_topic((form.get("topic") or "").strip())
    except ValidationError as exc:
        out.errors["topic"] = str(exc)
    try:
        values["data"] = check_data_text((form.get("data") or "").strip(), max_bytes)
    except ValidationError as exc:
        out.errors["data"] = str(exc)
    try:
        values["delay"] = _float(form.get("delay") or "0", 0, MAX_DELAY_SECONDS, "delay (seconds)")
    except ValueError as exc:
        out.errors["delay"] = str(exc)
    try:
        values["retry"] = _int(form.get("retry") or "0", 0, MAX_RETRIES, "retries")
    except ValueError as exc:
        out.errors["retry"] = str(exc)
    key = (form.get("unique_key") or "").strip()
    if len(key) > UNIQUE_KEY_MAX_LENGTH:
        out.errors["unique_key"] = f"unique key is at most {UNIQUE_KEY_MAX_LENGTH} characters"
    values["unique_key"] = key or None
    if not out.errors:
        out.value = values
    return out


def _optional(form: Mapping[str, str], name: str, parse: Any, errors: dict[str, str]) -> Any:
    raw = (form.get(name) or "").strip()
    if not raw:
        return None
    try:
        return parse(raw)
    except ValueError as exc:
        errors[name] = str(exc)
        return None


def parse_topic(name: str, form: Mapping[str, str]) -> Parsed:
    """A topic's settings form."""
    out = Parsed()
    e = out.errors
    fields: dict[str, Any] = {"name": name}
    required = {
        "retry_count": lambda s: _int(s, 0, MAX_RETRIES, "retry count"),
        "retry_base": lambda s: _float(s, 0, 86400 * 30, "backoff base (seconds)"),
        "retry_max": lambda s: _float(s, 0, 86400 * 365, "backoff cap (seconds)"),
        "ttr": lambda s: _int(s, 1, 86400 * 7, "time to run (seconds)"),
        "retention_days": lambda s: _int(s, 0, 3650, "retention (days)"),
        "max_deliveries": lambda s: _int(s, 1, MAX_DELIVERIES, "max deliveries"),
    }
    for key, parse in required.items():
        raw = (form.get(key) or "").strip()
        if not raw:
            e[key] = "required"
            continue
        try:
            fields[key] = parse(raw)
        except ValueError as exc:
            e[key] = str(exc)
    fields["max_data_bytes"] = _optional(
        form, "max_data_bytes", lambda s: _int(s, 1, 16 * 1024 * 1024 - 1, "max size (bytes)"), e)
    fields["alarm_backlog"] = _optional(form, "alarm_backlog", lambda s: _int(s, 1, 2**31 - 1, "backlog threshold"), e)
    fields["alarm_failure_rate"] = _optional(
        form, "alarm_failure_rate", lambda s: _float(s, 0, 1, "failure rate threshold"), e)
    fields["alarm_due_age"] = _optional(
        form, "alarm_due_age", lambda s: _int(s, 1, 2**31 - 1, "due age threshold (seconds)"), e)
    fields["result_retention_seconds"] = _optional(
        form, "result_retention_seconds", lambda s: _int(s, 0, 3650 * 86400, "result retention (seconds)"), e)
    fields["max_running"] = _optional(form, "max_running", lambda s: _limit(s, "max running"), e)
    fields["max_running_per_key"] = _optional(
        form, "max_running_per_key", lambda s: _limit(s, "max running per key"), e)
    fields["rate_per_second"] = _optional(form, "rate_per_second", _rate, e)
    fields["paused"] = form.get("paused") == "on"
    fields["archive"] = form.get("archive") == "on"
    description = (form.get("description") or "").strip()
    if len(description) > 1000:
        e["description"] = "description is at most 1000 characters"
    fields["description"] = description
    if "retry_base" in fields and "retry_max" in fields and fields["retry_max"] < fields["retry_base"]:
        e["retry_max"] = "backoff cap must be at least the backoff base"
    if not e:
        out.value = TopicSettings(**fields)
    return out


def _limit(text: str, what: str) -> int:
    value = whole_number(text, MAX_RUNNING_LIMIT, 1)
    if value is None:
        raise ValueError(f"{what} must be a whole number from 1 to {MAX_RUNNING_LIMIT:,}, or empty for no limit")
    return value


def _rate(text: str) -> float:
    value = _float(text, 0, MAX_RATE, "rate (messages per second)")
    if value <= 0:
        raise ValueError("rate (messages per second) must be above 0, or empty for no limit")
    return value


MAX_ID = 2**63 - 1  # the id column is a signed 64-bit integer
_ASCII_DIGITS = re.compile(r"[0-9]{1,20}")


def whole_number(text: str, high: int, low: int = 0) -> Optional[int]:
    """``text`` as an int in [low, high], or None: ASCII digits only (``str.isdigit`` also
    accepts "²", which ``int`` refuses), so nothing out of range reaches a query."""
    text = (text or "").strip()
    if not _ASCII_DIGITS.fullmatch(text):
        return None
    value = int(text)
    return value if low <= value <= high else None


def parse_ids(values: list[str]) -> list[int]:
    """Selected message ids from checkboxes; anything that is not an id is ignored."""
    return sorted({n for n in (whole_number(v, MAX_ID, 1) for v in values) if n is not None})


def parse_schedule(form: Mapping[str, str], name: Optional[str] = None) -> Parsed:
    """A schedule from the console's form; ``name`` when editing one (its name does not change)."""
    fields = {key: form.get(key, "").strip()
              for key in ("name", "topic", "cron", "timezone", "data", "retry", "missed")}
    errors: dict[str, str] = {}
    for key, check in (("cron", check_cron), ("timezone", check_timezone)):
        try:
            check(fields[key] or ("UTC" if key == "timezone" else ""))
        except ValidationError as exc:
            errors[key] = str(exc)
    retry = _optional(fields, "retry", lambda text: _int(text, 0, MAX_RETRIES, "retries"), errors)
    if "data" not in errors:
        try:
            check_data_text(fields["data"] or "null")
        except ValidationError as exc:
            errors["data"] = str(exc)
    if errors:
        return Parsed(errors=errors)
    try:
        value = check_schedule(name or fields["name"], fields["topic"], fields["cron"], fields["data"] or "null",
                               fields["timezone"] or "UTC", fields["missed"] or "once", retry, data_is_json=True)
    except ValidationError as exc:
        text = str(exc)
        where = "topic" if isinstance(exc, InvalidTopicError) else "missed" if text.startswith("missed") else "name"
        return Parsed(errors={where: text})
    return Parsed(value)
