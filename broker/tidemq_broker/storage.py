"""The storage interface: every database operation tidemq performs is one named method of a role.

A role is a protocol that one component of each implementation provides. :class:`Storage` holds one
component per role, as the factory ``tidemq_broker.storages.open_storage`` builds them around one
database (or ``storages.memory.open_memory_storage`` around one in-memory state); callers take the
roles they use and nothing reaches a database object behind them. Each transition of a message is one
operation and applies what ``tidemq.lifecycle`` decides for it. Every implementation passes tests/conformance;
each method is one transaction unless it says otherwise. The values operations take and return are in
``tidemq_broker.records`` (a workflow's in ``tidemq_broker.workflow_view``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Protocol, Sequence

from tidemq.lifecycle import Event
from tidemq.link import AckItem, AckOutcome

from .records import (COUNTED_FROM, SCAN_WINDOW, AdminUser, Backlog, FlowLimits, HandOff, LeasedMessage, LockHint,
                      LockRequest, MessageEdit, MessageFilter, MessagePage, MessageResult, NewRow, OutageGrace,
                      Principal, RecentInserts, RequestRef, Schedule, SessionUser, Shard, StoredMessage, TopicBacklog,
                      TopicCounts, TopicSettings, WorkflowStep, hours_ago)
from .workflow_store import WorkflowStore
from .workflow_view import WorkflowGraph, WorkflowPage

__all__ = [
    "Storage", "Schema", "MessageWrites", "DependencyWrites", "Leasing", "Acking", "Probes", "TopicStore",
    "MessageReads", "Counts", "ScheduleStore", "PrincipalStore", "SessionStore", "ConsoleStore", "WorkflowStep",
    "NewRow", "RequestRef", "RecentInserts", "LockHint", "Shard", "LockRequest", "StoredMessage", "LeasedMessage",
    "TopicSettings", "FlowLimits", "MessageFilter", "MessageEdit", "Backlog", "OutageGrace", "Schedule", "Principal",
    "SessionUser", "AdminUser", "MessagePage", "TopicBacklog", "TopicCounts", "SCAN_WINDOW", "COUNTED_FROM",
    "hours_ago", "AckItem", "AckOutcome", "MessageResult", "WorkflowPage", "WorkflowGraph"]


class Schema(Protocol):
    """The schema and the database's presence."""

    def create_schema(self) -> None:
        """Create the tables and indexes that are missing (idempotent). An empty database is
        stamped with the current schema version; an older schema is left to ``migrate``."""

    def schema_version(self) -> int:
        """The highest schema version applied (0 when none is recorded)."""

    def migrate(self, version: int) -> None:
        """Apply the schema step to ``version`` (one above the current) and record it."""

    def ping(self) -> None:
        """Raise StorageUnavailableError unless the database answers."""


class MessageWrites(Protocol):
    """Produce, and the transitions producers and operators start (``tidemq.lifecycle``)."""

    def insert_messages(self, rows: Sequence[NewRow], now: datetime, requests: Sequence[RequestRef] = (),
                        handoff: Optional[HandOff] = None, **who: object) -> list[int]:
        """Produce: insert ``rows`` as NEW in one transaction and return their ids in order.
        A row whose (topic, unique_key) is already stored is not inserted again; its existing
        id is returned. Either every row is stored or none is. ``who`` goes to the trace.
        ``requests`` name Produce calls among the rows: a call whose request id is already
        stored (committed before, here or through another broker) stores nothing and gets the
        ids it was first answered; the others' request ids are stored in the same transaction.
        ``handoff``: the new rows due now that waiting pulls take are leased to them in it."""

    def delete_produce_requests(self, before: datetime, limit: int) -> int:
        """Forget up to ``limit`` request ids stored before ``before``; returns how many."""

    def cancel(self, ids: Sequence[int], released: Optional[dict[str, dict[int, int]]] = None,
               running_at: Optional[datetime] = None, topics: Optional[set[str]] = None, **who: object) -> list[bool]:
        """Delete the messages not run yet (NEW, WAITING); with ``running_at``, mark the RUNNING ones
        in the same transaction (``lifecycle.request_cancel``, once each; ``who`` goes to the trace)
        and put their topics in ``topics``, for the caller to signal. True for each one deleted or
        RUNNING. ``released``: as ``ack``'s."""

    def forget_results(self, topic: str, before: datetime, limit: int) -> int:
        """Result retention: clear the result and progress of up to ``limit`` finished messages
        of ``topic`` finished before ``before`` (``lifecycle.forget_result``); returns how many."""

    def requeue(self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime,
                event: Event = Event.REQUEUED, topics: Optional[set[str]] = None, **who: object) -> int:
        """Put FAIL messages (by id, or every one of ``topic``) back to NEW, due now, with ``retry``
        retries left after the new attempt (0: one more attempt), in batches of 1000 (by id: the first
        1000 of ``ids``): no transaction holds many row locks. How many moved; their topics go in ``topics``."""

    def edit_message(self, id: int, version: int, edit: MessageEdit, now: datetime, user: str, changed: Sequence[str],
                     released: Optional[dict[str, dict[int, int]]] = None) -> Optional[StoredMessage]:
        """An operator's edit, applied if the message is still at ``version`` and not RUNNING.
        Returns the updated message, or None when it changed meanwhile, is RUNNING or is gone.
        ``released``: as ``ack``'s (an edit that ends a step releases what waits on it)."""

    def delete_messages(self, ids: Sequence[int], released: Optional[dict[str, dict[int, int]]] = None) -> int:
        """An operator's delete of messages not RUNNING (a consumer holds those); how many went.
        ``released``: as ``ack``'s."""

    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        """Retention: delete up to ``limit`` SUCCESS messages of ``topic`` finished before ``before``."""


class DependencyWrites(WorkflowStore, Protocol):
    """Messages that wait for others (their release is in ``ack``), and their workflows."""

    def insert_steps(self, steps: Sequence[WorkflowStep], now: datetime, request_id: str = "",
                     **who: object) -> list[int]:
        """Insert ``steps``, their edges and their workflow's row, all or nothing (a ``DependencyError``
        names the bad id, the cycle or the limit); return their ids in order. A step waits as its
        ``wait_mode`` says (``storages/steps.py``'s plan). Steps and the messages they wait on get
        ``workflow_id``. A ``request_id`` stored already is answered as ``insert_messages`` does."""


class Leasing(Protocol):
    """Leases: NEW -> RUNNING under a token, and every change of a RUNNING row by that token."""

    def lock_batch(self, request: LockRequest) -> list[LeasedMessage]:
        """Lease up to ``request.limit`` NEW messages of its shard due by ``now + ahead``, higher
        priority first, then oldest due first; with ``shard.hint.stranded`` > 0 (seconds), fill
        what is left with other shards' messages due for longer than that (their consumer
        stopped pulling: it died, and ZooKeeper has not ended its session yet).

        Never waits for a row another transaction holds, never locks an index range
        (``storages/claims.py``): the lifecycle's lease (``lease_expire = now + ahead + ttr``)
        goes to the rows locked by key. With ``request.limits`` the lock first locks the topic's
        row and takes only what its stored limits allow, so they hold across brokers. The hint
        says where the messages can be; the lock reads only there."""

    def lock_serial(self, request: LockRequest) -> list[LeasedMessage]:
        """Lease the head of a serial topic: the NEW message first in (order_time, id), if due by
        ``now + ahead`` and if no message of the topic is RUNNING. Returns zero or one message."""

    def release(self, lease_token: str, now: datetime, consumer: str = "", broker: str = "") -> int:
        """Give back the messages leased under ``lease_token`` that nobody will run (the pull's
        caller went away before the reply): RUNNING -> NEW, the attempt not counted."""

    def extend_leases(self, leases: Sequence[tuple[int, str]], ttr: int, now: datetime) -> list[bool]:
        """Extend each (id, token) lease still held to now + ``ttr`` (heartbeats, touch); one
        bool per lease, False for a lease already lost."""

    def report_progress(self, reports: Sequence[tuple[int, str, str]], now: datetime) -> list[bool]:
        """Store each (id, token, progress JSON) on its message while that lease is held
        (``lifecycle.report_progress``); one bool per report, False for a lease already lost."""

    def cancels_requested(self, leases: Sequence[tuple[int, str]]) -> list[bool]:
        """One bool per (id, token): True when that lease is held and a cancel of its message
        was requested (what a heartbeat's reply tells the worker)."""

    def expire_leases(self, now: datetime, limit: int, broker: str, max_deliveries: Callable[[str], int],
                      by_topic: Optional[dict[str, int]] = None, grace: Optional[OutageGrace] = None) -> int:
        """Up to ``limit`` RUNNING messages whose lease ran out: back to NEW (due now), or to FAIL
        once delivered ``max_deliveries(topic)`` times. Returns how many moved, and adds them per
        topic to ``by_topic`` when given (the metrics). ``grace``: leases that ran out during a
        database outage stay held until its end plus their ttr (see :class:`OutageGrace`)."""


class Acking(Protocol):
    """Outcomes of leases."""

    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings], released: Optional[dict[str, dict[int, int]]] = None,
            handoff: Optional[HandOff] = None, committed: Optional[Callable[[], None]] = None) -> list[AckOutcome]:
        """Apply many outcomes in one transaction, each guarded by status RUNNING and its token:
        ``lifecycle.succeed`` or ``lifecycle.fail_attempt`` (a retry or FAIL). An outcome that lease
        already recorded (the same ack again, its reply lost) is APPLIED and changes nothing; any
        other is STALE. In the same transaction a SUCCESS releases the dependents it was the last
        wait of ({id: priority} per topic added to ``released``: the pulls to wake; those due now
        leased to the pulls waiting through ``handoff``), a FAIL or CANCELLED stops the rest.
        ``committed()``: right after the COMMIT (and the hand-off's delivery), to wake waiters."""


class Probes(Protocol):
    """The cheap reads the pull hub makes to know when to look again."""

    def next_due(self, shard: Shard) -> Optional[datetime]:
        """The earliest effect_time of NEW messages in the shard (None when none), read where its
        hint says they can be; with ``hint.stranded``, also other shards' earliest plus that
        much: when a lock that takes stranded messages would take it."""

    def earliest_new(self, topics: Sequence[str]) -> dict[str, dict[int, datetime]]:
        """{topic: {priority: earliest effect_time of its NEW messages of that priority}} for the topics
        that have any, read without hints: the pull hub's shared probe and the audit of its lock hints."""

    def serial_head_due(self, topic: str) -> Optional[datetime]:
        """The effect_time of a serial topic's head (first NEW in (order_time, id)); None when a
        message of the topic is RUNNING or nothing is NEW."""

    def finished(self, ids: Sequence[int]) -> list[int]:
        """The ids among ``ids`` whose messages are final (SUCCESS, FAIL or CANCELLED) or gone:
        the result waiters' shared probe, one statement per thousand ids."""

    def max_id(self) -> int:
        """The highest message id (0 for an empty table): a cheap 'anything new?' probe."""

    def id_step(self) -> int:
        """How far apart the ids one server hands out are: ``auto_increment_increment`` on MySQL
        (a Galera cluster of n nodes sets n), 1 elsewhere."""

    def recent_inserts(self, after: int, missing: Sequence[int], limit: int) -> RecentInserts:
        """The first ``limit`` stored messages, in id order, whose id is above ``after`` or in
        ``missing``, grouped by topic and priority (see RecentInserts), and the highest id
        stored: the pull hub's probe of messages committed elsewhere (``tidemq_broker.inserts``)."""


class TopicStore(Protocol):
    """Per-topic settings (defaults apply to a topic without a row)."""

    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        """Create default settings rows for topics that have none."""

    def list_topics(self) -> list[TopicSettings]:
        """Every configured topic, by name."""

    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        """Insert or update one topic's settings."""

    def set_topic_limits(self, name: str, limits: FlowLimits, now: datetime) -> None:
        """Set one topic's flow limits (None: no such limit), creating its row if needed; the
        rate's token bucket starts full."""


class MessageReads(Protocol):
    """Lookups of stored messages."""

    def get_message(self, id: int) -> Optional[StoredMessage]:
        """One message by id."""

    def message_topics(self, ids: Sequence[int]) -> set[str]:
        """The topics of the stored messages among ``ids`` (what a permission check looks at)."""

    def lease_topics(self, lease_token: str) -> set[str]:
        """The topics of the RUNNING messages leased under ``lease_token``."""

    def get_results(self, ids: Sequence[int]) -> list[MessageResult]:
        """The status, result and progress of the stored messages among ``ids``, in id order
        (an id not stored has none)."""


class Counts(Protocol):
    """Counts of messages per topic: the leader's gauges and the counts the console shows."""

    def backlog(self, now: datetime) -> list[Backlog]:
        """Every topic with NEW or RUNNING messages: due, scheduled and running counts and the
        oldest due effect_time, in one grouped query (the leader's backlog gauges, every few
        seconds; it counts those rows along the (topic, status, effect_time) index)."""

    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        """{topic: {status: count}} for one topic or all."""

    def save_topic_counts(self, counts: dict[str, dict[str, int]], now: datetime) -> None:
        """Replace the stored count per topic and status (the leader's, read by the console)."""


class ScheduleStore(Protocol):
    """Periodic messages (``tidemq_broker.schedules`` checks and ticks them)."""

    def put_schedule(self, schedule: Schedule, now: datetime) -> bool:
        """Insert or update a schedule by name (an idempotent declaration); True when it is new.

        A new schedule's ticks start after ``now``. An update keeps ``paused`` and ``last_tick``;
        when it changes the cron expression or the time zone, ticks start after ``now`` again."""

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""

    def get_schedule(self, name: str) -> Optional[Schedule]:
        """One schedule by name."""

    def delete_schedule(self, name: str) -> bool:
        """Remove a schedule (messages already produced stay); False when there was none."""

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> bool:
        """Pause or resume a schedule; a resumed one ticks only after ``now`` (what fell in the
        pause is not caught up). False when there is no such schedule."""

    def advance_schedule(self, name: str, tick: datetime) -> bool:
        """Record ``tick`` as handled unless a later one already is; False when nothing moved."""


class PrincipalStore(Protocol):
    """The principals brokers that authenticate accept, stored with a hash of their token."""

    def add(self, name: str, role: str, topics: tuple[str, ...], token_hash: str, now: datetime) -> None:
        """Store a new principal. A revoked one of the same name is replaced; an active one is
        refused (``ValidationError``): revoke it first, so a token is never replaced silently."""

    def revoke(self, name: str, now: datetime) -> bool:
        """Revoke ``name``; False when there is no active principal of that name."""

    def list(self) -> list[Principal]:
        """Every principal, revoked ones included, by name."""

    def active(self) -> dict[str, Principal]:
        """Principals not revoked, by token hash (what a broker's cache holds)."""


class SessionStore(Protocol):
    """The console's sign-in state: sessions (only a hash of their id is stored) and the shared
    count of failed sign-ins per key."""

    def create(self, user_name: str, now: datetime) -> str:
        """Start a session for ``user_name``; returns the id to hand to the browser (shown once)."""

    def resolve(self, session_id: str, now: datetime, idle: timedelta, lifetime: timedelta) -> Optional[SessionUser]:
        """The user of a live session, or None when the id is unknown, ended, idle longer than
        ``idle`` or older than ``lifetime`` (such a session is deleted)."""

    def end(self, session_id: str) -> None:
        """End one session (sign-out)."""

    def end_all(self, user_name: str) -> int:
        """End every session of ``user_name`` (its password changed); returns how many."""

    def count(self, user_name: str) -> int:
        """How many sessions ``user_name`` has (live or not yet swept)."""

    def sweep(self, now: datetime, idle: timedelta, lifetime: timedelta, failures_kept: timedelta) -> None:
        """Delete expired sessions and failure counts nobody has added to for ``failures_kept``."""

    def reserve_attempt(self, keys: Sequence[str], now: datetime,
                        wait_for: Callable[[dict[str, tuple[int, datetime]]], float]) -> float:
        """Count a sign-in attempt as a failure of each of ``keys`` before its password is
        checked, unless ``wait_for(failures so far)`` says to wait: then return that wait and
        count nothing. Parallel attempts are counted one after another."""

    def attempt_succeeded(self, clear: Sequence[str], undo: Sequence[str]) -> None:
        """The password was right: forget the failures of ``clear``, and take back the attempt
        counted on ``undo`` (a key whose earlier failures stay)."""


class ConsoleStore(Protocol):
    """What the console reads and changes beyond the broker's operations: users, pages of
    messages and of workflows, a workflow's graph, and the dashboard's figures."""

    def get_user(self, name: str) -> Optional[AdminUser]:
        """The user called ``name``, if any."""

    def users(self) -> list[AdminUser]:
        """Every user, by name."""

    def save_user(self, name: str, password_hash: str, role: str, now: datetime) -> bool:
        """Create the user or replace its password and role (ending its sessions); True if created."""

    def list_page(self, flt: MessageFilter, limit: int, before_id: Optional[int] = None,
                  window: int = SCAN_WINDOW) -> MessagePage:
        """A page of messages matching ``flt`` with ids below ``before_id``, newest first. A
        filter no index answers (text, time ranges) examines at most ``window`` ids per page."""

    def results_page(self, topic: str, limit: int, before_id: Optional[int] = None) -> list[MessageResult]:
        """Up to ``limit`` finished messages of ``topic`` holding a result, below ``before_id``, newest first."""

    def matching_ids(self, flt: MessageFilter, after_id: int, limit: int) -> list[int]:
        """Ids above ``after_id`` matching ``flt`` (every criterion), ascending: for bulk actions."""

    def topics_present(self) -> list[str]:
        """Every topic that has messages."""

    def topic_counts(self, known: Optional[dict[str, dict[str, int]]] = None,
                     topics: Optional[Sequence[str]] = None) -> TopicCounts:
        """Messages per topic and status. A status the leader's stored count puts at ``COUNTED_FROM``
        or more is taken from it, with its time; the others are counted now. ``known``: counts the
        caller made just now ({topic: {status: n}}). ``topics``: the topics present, when known."""

    def backlog(self, topics: Sequence[str], now: datetime) -> dict[str, TopicBacklog]:
        """Due and scheduled NEW counts per topic."""

    def topic_stats(self, since: datetime) -> dict[str, list[dict[str, Any]]]:
        """The pipeline's hourly report rows since ``since``, per topic, oldest first."""

    def open_alarms(self, limit: int = 50) -> list[dict[str, Any]]:
        """The pipeline's alarms not resolved yet, newest first."""

    def workflow_page(self, state: Optional[str], limit: int, before_id: Optional[int] = None,
                      window: int = SCAN_WINDOW) -> WorkflowPage:
        """Workflows below ``before_id`` in ``state``, newest first, ``window`` ids examined a page."""

    def workflow_graph(self, workflow_id: int, limit: int) -> Optional[WorkflowGraph]:
        """A workflow's first ``limit`` messages and their edges; None when it has no step."""


@dataclass(frozen=True)
class Storage:
    """One storage: a component per role, all over the same database (or in-memory state);
    ``close`` releases what the factory opened (the connection pools), after which none is usable."""

    schema: Schema
    messages: MessageWrites
    dependencies: DependencyWrites
    leases: Leasing
    acks: Acking
    probes: Probes
    topics: TopicStore
    reads: MessageReads
    counts: Counts
    schedules: ScheduleStore
    principals: PrincipalStore
    sessions: SessionStore
    console: ConsoleStore
    closer: Callable[[], None] = lambda: None

    def close(self) -> None:
        """Release the database's connections."""
        self.closer()
