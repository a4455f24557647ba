"""Input checks shared by the client (fail before the network) and the broker (trust no client).

The limits they check are defined in :mod:`tidemq.limits` (and exported here too).

Each check raises a ValidationError subclass whose message names the limit or the expected form.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Optional, Sequence, Union

from .errors import (
    DataTooLargeError,
    InvalidDataError,
    InvalidDelayError,
    InvalidRetryError,
    InvalidTopicError,
    MalformedRequestError,
    WorkflowTooLargeError,
    quote,
)
from .limits import (
    DEFAULT_MAX_DATA_BYTES,
    FLOW_KEY_MAX_LENGTH,
    MAX_AHEAD,
    MAX_BATCH,
    MAX_DATA_DEPTH,
    MAX_DELAY_SECONDS,
    MAX_PULL,
    MAX_RETRIES,
    MAX_TTR,
    MAX_WAIT,
    MAX_WORKFLOW_STEPS,
    MIN_TTR,
    PRIORITIES_DESC,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TOPIC_MAX_LENGTH,
    UNIQUE_KEY_MAX_LENGTH,
    check_lease_token,
)

__all__ = [
    "parse_strict",
    "TOPIC_MAX_LENGTH",
    "UNIQUE_KEY_MAX_LENGTH",
    "DEFAULT_MAX_DATA_BYTES",
    "MAX_DELAY_SECONDS",
    "MAX_RETRIES",
    "MAX_BATCH",
    "check_topic",
    "encode_data",
    "check_delay",
    "check_effect_time",
    "check_when",
    "parse_retry",
    "parse_duration",
    "check_unique_key",
    "check_batch_size",
    "check_workflow_steps",
    "check_data_text",
    "check_depth",
    "MAX_DATA_DEPTH",
    "FLOW_KEY_MAX_LENGTH",
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "PRIORITIES_DESC",
    "check_flow_key",
    "check_priority",
    "check_pull",
    "check_lease_ttr",
]

_TOPIC_RE = re.compile(r"[A-Za-z0-9._:-]+")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def check_topic(topic: Any) -> str:
    """Return ``topic`` if it is a valid topic name, else raise InvalidTopicError."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError(f"topic must be a non-empty string, got {quote(topic)}")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidTopicError(
            f"topic is {len(topic)} characters long; the limit is {TOPIC_MAX_LENGTH}"
        )
    if not _TOPIC_RE.fullmatch(topic):
        raise InvalidTopicError(
            f"topic {quote(topic)} has characters outside [A-Za-z0-9._:-]"
        )
    return topic




#: Made once: ``json.dumps`` with options builds an encoder per call, a third of the cost of
#: encoding a small message.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def encode_data(data: Any, max_bytes: int = DEFAULT_MAX_DATA_BYTES) -> str:
    """Serialise ``data`` to compact JSON text, enforcing the size limit in UTF-8 bytes."""
    try:
        text = _ENCODE(data)
    except (TypeError, ValueError) as exc:
        raise InvalidDataError(f"data must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidDataError(
            f"data nests lists and objects deeper than {MAX_DATA_DEPTH} levels (the limit)") from None
    check_data_size(text, max_bytes)
    if text.count("[") + text.count("{") > MAX_DATA_DEPTH:
        check_depth(data)
    return text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


#: Made once: ``json.loads`` with an option builds a decoder per call, a fifth of the cost of
#: checking a small message (every produced message and every result is checked).
_STRICT = json.JSONDecoder(parse_constant=_no_constant)


def parse_strict(text: str) -> Any:
    """Parse JSON text as RFC 8259 has it (no NaN or Infinity); ValueError when it is not."""
    return _STRICT.decode(text)


def check_depth(value: Any) -> None:
    """Raise InvalidDataError when ``value`` nests lists and objects deeper than MAX_DATA_DEPTH."""
    containers = [value] if isinstance(value, (list, dict)) else []
    for _ in range(MAX_DATA_DEPTH):  # one level of containers per turn, breadth first
        containers = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)
                      if isinstance(child, (list, dict))]
        if not containers:
            return
    raise InvalidDataError(f"data nests lists and objects deeper than {MAX_DATA_DEPTH} levels (the limit)")


def check_data_text(text: str, max_bytes: int = DEFAULT_MAX_DATA_BYTES) -> str:
    """Check JSON text received over the wire: size first (cheap), then that it parses as
    strict JSON (no NaN or Infinity) nested at most MAX_DATA_DEPTH deep."""
    check_data_size(text, max_bytes)
    try:
        value = parse_strict(text)
    except ValueError as exc:
        raise InvalidDataError(f"data must be valid JSON text: {exc}") from None
    except RecursionError:
        raise InvalidDataError(
            f"data nests lists and objects deeper than {MAX_DATA_DEPTH} levels (the limit)") from None
    # Only text with that many brackets can be that deep: the walk is skipped for everything else.
    if text.count("[") + text.count("{") > MAX_DATA_DEPTH:
        check_depth(value)
    return text


def check_data_size(text: str, max_bytes: int) -> None:
    """Raise DataTooLargeError when ``text`` is larger than ``max_bytes`` in UTF-8."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise DataTooLargeError(
            f"data is {size} bytes as JSON; the limit is {max_bytes} bytes"
        )


def check_delay(delay: Any) -> float:
    """Return ``delay`` in seconds if it is a finite number in [0, 10 years]."""
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise InvalidDelayError(f"delay must be a number of seconds, got {quote(delay)}")
    if not math.isfinite(delay) or delay < 0:
        raise InvalidDelayError(
            f"delay must be between 0 and {MAX_DELAY_SECONDS} seconds (10 years), got {quote(delay)}")
    if delay > MAX_DELAY_SECONDS:
        raise InvalidDelayError(
            f"delay of {delay:.0f} s is more than the limit of {MAX_DELAY_SECONDS} s (10 years)"
        )
    return float(delay)


def check_effect_time(effect_time: Any, now: Optional[datetime] = None) -> datetime:
    """Return ``effect_time`` as an aware UTC datetime no more than 10 years ahead.

    A naive datetime is taken as local time, as ``datetime.now()`` gives it. A time in the past
    is accepted: the message is due at once.
    """
    if not isinstance(effect_time, datetime):
        raise InvalidDelayError(f"effect_time must be a datetime, got {quote(effect_time)}")
    aware = effect_time.astimezone(timezone.utc)
    now = now or datetime.now(timezone.utc)
    if (aware - now).total_seconds() > MAX_DELAY_SECONDS:
        raise InvalidDelayError(
            f"effect_time {effect_time.isoformat()} is more than 10 years ahead (the limit)"
        )
    return aware


def check_when(delay: Any, effect_time: Any) -> tuple[Optional[float], Optional[datetime]]:
    """A produce call's due time: ``delay`` seconds (checked) or ``effect_time`` (checked, aware
    UTC), never both; (None, None) means now."""
    if delay is not None and effect_time is not None:
        raise InvalidDelayError("give delay or effect_time, not both")
    return (check_delay(delay) if delay is not None else None,
            check_effect_time(effect_time) if effect_time is not None else None)


def parse_duration(value: Any) -> float:
    """Parse one retry delay: seconds as a number, or a string like "500ms", "30s", "2m", "1h", "1d"."""
    if isinstance(value, bool):
        raise InvalidRetryError(f"retry delay must be seconds or a string like '2m', got {quote(value)}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise InvalidRetryError(
            f"retry delay {quote(value)} is not of the form 10, 2.5, '500ms', '30s', '2m', '1h' or '1d'"
        )
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY_SECONDS:
        raise InvalidRetryError(f"retry delay must be between 0 and {MAX_DELAY_SECONDS} s, got {quote(value)}")
    return seconds


def parse_retry(retry: Union[None, int, Sequence[Any]]) -> tuple[int, Optional[list[float]]]:
    """Normalise ``retry`` to (count, schedule).

    None gives (-1, None): the topic's default. An int gives (n, None): n retries on the topic's
    backoff. A list gives (len, [seconds, ...]): one delay per further attempt.
    """
    if retry is None:
        return -1, None
    if isinstance(retry, bool):
        raise InvalidRetryError(f"retry must be a count or a list of delays, got {quote(retry)}")
    if isinstance(retry, int):
        if not 0 <= retry <= MAX_RETRIES:
            raise InvalidRetryError(f"retry count must be between 0 and {MAX_RETRIES}, got {retry}")
        return retry, None
    if isinstance(retry, (list, tuple)):
        if len(retry) > MAX_RETRIES:
            raise InvalidRetryError(f"retry schedule has {len(retry)} entries; the limit is {MAX_RETRIES}")
        schedule = [parse_duration(v) for v in retry]
        return len(schedule), schedule
    raise InvalidRetryError(f"retry must be a count or a list of delays, got {type(retry).__name__}")


def check_unique_key(key: Any) -> str:
    """Return the unique key ('' for none) if it is a string of at most 255 characters."""
    if key is None:
        return ""
    if not isinstance(key, str):
        raise MalformedRequestError(f"unique_key must be a string, got {type(key).__name__}")
    if len(key) > UNIQUE_KEY_MAX_LENGTH:
        raise MalformedRequestError(
            f"unique_key is {len(key)} characters long; the limit is {UNIQUE_KEY_MAX_LENGTH}"
        )
    return key


def check_batch_size(items: Iterable[Any] | Sequence[Any], what: str = "messages") -> None:
    """Raise MalformedRequestError for an empty batch or one larger than MAX_BATCH."""
    n = len(items)  # type: ignore[arg-type]
    if n == 0:
        raise MalformedRequestError(f"a batch needs at least one of its {what}")
    if n > MAX_BATCH:
        raise MalformedRequestError(f"a batch has {n} {what}; the limit is {MAX_BATCH} per call")


def check_workflow_steps(count: int) -> None:
    """Raise WorkflowTooLargeError, naming the limit, for a submission of more than
    MAX_WORKFLOW_STEPS steps (the client's stub, the broker's intake and every storage)."""
    if count > MAX_WORKFLOW_STEPS:
        raise WorkflowTooLargeError(f"a submission may hold at most {MAX_WORKFLOW_STEPS:,} steps "
                                    f"(MAX_WORKFLOW_STEPS), got {count:,}: split it into several")


def check_flow_key(key: Any) -> str:
    """A producer's key for per-key flow limits (``produce(..., key=...)``); "" means none."""
    if key is None:
        return ""
    if not isinstance(key, str):
        raise MalformedRequestError(f"key must be a string, got {type(key).__name__}")
    if len(key) > FLOW_KEY_MAX_LENGTH:
        raise MalformedRequestError(f"key is {len(key)} characters long; the limit is {FLOW_KEY_MAX_LENGTH}")
    return key


def check_priority(priority: Any) -> int:
    """A message's priority: a whole number from PRIORITY_MIN to PRIORITY_MAX, higher first."""
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise MalformedRequestError(
            f"priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX} (higher first), "
            f"got {quote(priority)}")
    return priority


def check_pull(topic: str, *, rank: int, total: int, max_messages: int, wait: float, ttr: float, ahead: float,
               consumer: str = "", lease_token: str = "", hold: float = 0.0) -> None:
    """Refuse a pull whose numbers make no sense (ttr 0: the topic's default)."""
    check_topic(topic)
    if not 1 <= max_messages <= MAX_PULL:
        raise MalformedRequestError(f"max_messages must be between 1 and {MAX_PULL}, got {max_messages}")
    if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT):
        raise MalformedRequestError(f"wait_seconds must be between 0 and {MAX_WAIT}, got {wait}")
    if not (math.isfinite(ttr) and 0 <= ttr <= MAX_TTR):
        raise MalformedRequestError(f"ttr_seconds must be between 0 (topic default) and {MAX_TTR}, got {ttr}")
    if not (math.isfinite(ahead) and 0 <= ahead <= MAX_AHEAD):
        raise MalformedRequestError(f"ahead_seconds must be between 0 and {MAX_AHEAD}, got {ahead}")
    if not (math.isfinite(hold) and 0 <= hold <= MAX_TTR):
        raise MalformedRequestError(f"hold_seconds must be between 0 (the ttr) and {MAX_TTR}, got {hold}")
    if total < 1 or not 0 <= rank < total:
        raise MalformedRequestError(f"rank must be in [0, total) with total >= 1, got rank={rank} total={total}")
    if len(consumer) > 255:
        raise MalformedRequestError("consumer name is longer than 255 characters")
    if lease_token:
        check_lease_token(lease_token)


def check_lease_ttr(seconds: float) -> int:
    """A lease extension's ttr, rounded to whole seconds, MIN_TTR to MAX_TTR (NaN and infinity refused)."""
    if not (math.isfinite(seconds) and MIN_TTR <= round(seconds) <= MAX_TTR):
        raise MalformedRequestError(f"ttr_seconds must be between {MIN_TTR} and {MAX_TTR}, got {seconds}")
    return int(round(seconds))
