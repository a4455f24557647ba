"""Every bound tidemq puts on input, and the form of a lease token: one place for the client, the
stub broker and the broker.

The client checks before the network, the broker again because it trusts no client, and the
stub broker as the broker does; each imports the numbers from here, so a limit changed here
changes for all of them. The checks themselves live in :mod:`tidemq.validation` (messages) and
the broker's ``intake`` (requests).
"""

from __future__ import annotations

import re
import uuid

from .errors import MalformedRequestError, quote

__all__ = [
    "TOPIC_MAX_LENGTH", "UNIQUE_KEY_MAX_LENGTH", "FLOW_KEY_MAX_LENGTH", "PRIORITY_MIN", "PRIORITY_MAX",
    "PRIORITIES_DESC", "DEFAULT_MAX_DATA_BYTES", "MAX_DATA_DEPTH", "MAX_DELAY_SECONDS", "MAX_RETRIES", "MAX_BATCH",
    "MAX_PULL", "MAX_WAIT", "MIN_TTR", "MAX_TTR", "MAX_AHEAD", "new_lease_token", "check_lease_token",
    "DEFAULT_MAX_RESULT_BYTES", "MAX_RESULT_IDS", "MAX_PROGRESS_NOTE", "MAX_ERROR_TRACEBACK",
    "MAX_WORKFLOW_STEPS", "MAX_DEPENDENCIES",
]

# -- messages --------------------------------------------------------------------------------
TOPIC_MAX_LENGTH = 255
UNIQUE_KEY_MAX_LENGTH = 255
FLOW_KEY_MAX_LENGTH = 255
# A small fixed range: the broker's lock names every priority, which keeps each one a range of
# its index that stops at the first message not yet due (tidemq_broker.schema).
PRIORITY_MIN, PRIORITY_MAX = 0, 9
PRIORITIES_DESC = tuple(range(PRIORITY_MAX, PRIORITY_MIN - 1, -1))
DEFAULT_MAX_DATA_BYTES = 1024 * 1024
#: How deep message data may nest lists and objects: deeper data is refused where it enters, so no
#: reader (the console's editor and pretty printer, a handler's json.loads) meets it.
MAX_DATA_DEPTH = 64
MAX_DELAY_SECONDS = 10 * 366 * 24 * 3600  # ten years, leap days included
MAX_RETRIES = 1000
MAX_BATCH = 10_000  # messages (or ids, acks, leases) per call

# -- pulls and leases ------------------------------------------------------------------------
MAX_PULL = 1000  # messages one pull may lease
MAX_WAIT = 60.0  # seconds a pull may long-poll
MIN_TTR = 1  # seconds: a broker leases in whole seconds
MAX_TTR = 7 * 24 * 3600
MAX_AHEAD = 10.0  # seconds before due a pull may hand a message out

# -- results and progress --------------------------------------------------------------------
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024  # a handler's return value as JSON (TIDEMQ_MAX_RESULT_BYTES)
MAX_RESULT_IDS = 1000  # ids one Results call may read or wait for
MAX_PROGRESS_NOTE = 512  # characters of a progress report's note (the stored JSON fits 1024 bytes)
MAX_ERROR_TRACEBACK = 8 * 1024  # characters of a failure's traceback kept in its error result

# -- dependencies between messages -----------------------------------------------------------
# Steps of one submission: all of them, their edges and the release of the first ones are one
# transaction, which must stay short enough not to hold a broker's commit slot for long. Above
# MAX_BATCH by a margin, so that a group as wide as one produce batch goes in one submission with
# what comes after it (a chord's body, a batch's three callbacks, a short chain).
MAX_WORKFLOW_STEPS = MAX_BATCH + 100
# Stored messages one step may wait on (``depends_on``): the submission reads and locks each of
# them. The steps of its own submission a step comes after (``after``: a chord's body after every
# member) are bounded by MAX_WORKFLOW_STEPS alone: their edges go in with the steps, in one INSERT,
# and an ack lowers the count of a fan-in's step as it lowers any other.
MAX_DEPENDENCIES = 1000

_LEASE_TOKEN = re.compile(r"[0-9a-f]{32}")


def new_lease_token() -> str:
    """A fresh, unguessable lease token: 32 lowercase hex characters (a uuid4's hex)."""
    return uuid.uuid4().hex


def check_lease_token(token: str) -> str:
    """Return ``token`` if it has a lease token's form (32 lowercase hex characters, as
    :func:`new_lease_token` makes), else raise MalformedRequestError naming the form."""
    if not isinstance(token, str) or not _LEASE_TOKEN.fullmatch(token):
        raise MalformedRequestError(f"lease_token must be 32 lowercase hex characters, got {quote(token)}")
    return token
