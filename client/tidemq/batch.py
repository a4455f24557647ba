"""BatchConsumer: pull-style consuming for batch jobs."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from . import tracing
from .errors import MalformedRequestError
from .link import AckItem, AckOutcome, BrokerLink, Delivery
from .message import Message
from .results import encode_result
from .queue_runner import delivery_to_message
from .validation import check_topic
from .worker import default_instance

__all__ = ["BatchConsumer", "AckResult", "PulledLeases"]


class AckResult:
    """Which outcomes were recorded and which were refused because the lease was lost."""

    def __init__(self, applied: list[int], stale: list[int]) -> None:
        self.applied = applied
        self.stale = stale

    def __repr__(self) -> str:
        return f"AckResult(applied={len(self.applied)}, stale={self.stale})"


class BatchConsumer:
    """Pull many messages, process them your way, report many outcomes in one call.

    >>> consumer = BatchConsumer("report.build", ttr=60)
    >>> batch = consumer.pull(max_messages=100, wait=5.0)
    >>> consumer.ack(succeeded=[m.id for m in batch])

    ``client`` is any BrokerLink: the process-wide Client by default, a StubBroker in tests.

    With OpenTelemetry set up, each pulled message has a ``process <topic>`` span, a child of
    its producer's span as a worker's handler run is, from the pull to its ack (status ERROR
    when acknowledged as failed); ``with consumer.processing(message):`` makes it current, so
    spans made while working on that message join the message's trace.
    """

    def __init__(self, topic: str, ttr: float = 60.0, client: Optional[BrokerLink] = None,
                 name: Optional[str] = None) -> None:
        self.topic = check_topic(topic)
        self.ttr = ttr
        self.client = client or _default_client()
        self.name = name or f"batch-{default_instance()}"
        self._leases = PulledLeases()

    def pull(self, max_messages: int = 100, wait: float = 5.0) -> list[Message]:
        """Lease up to ``max_messages`` due messages, waiting up to ``wait`` seconds for the first."""
        deliveries = self.client.pull(self.topic, self.name, max_messages=max_messages, wait=wait, ttr=self.ttr)
        self._leases.remember(deliveries)
        return [delivery_to_message(d, self.client) for d in deliveries]

    def ack(self, succeeded: Sequence[int] = (), failed: Union[Sequence[int], Mapping[int, str]] = (),
            results: Optional[Mapping[int, Any]] = None) -> AckResult:
        """Record successes and failures (optionally {id: error text}) in one transaction, with
        ``results`` ({id: JSON value} of succeeded messages) stored with their SUCCESS; a value
        that is not JSON or too large is refused before anything is sent."""
        items = self._leases.items(succeeded, failed, results)
        return self._leases.result(items, self.client.ack(self.topic, self.name, items))

    def processing(self, message: Message) -> "contextlib.AbstractContextManager[Any]":
        """Make ``message``'s ``process`` span current for a block (see the class)."""
        return self._leases.processing(message.id)


class PulledLeases:
    """The lease tokens of the messages a batch consumer pulled and has not acknowledged yet
    (shared by :class:`BatchConsumer` and :class:`tidemq.aio.BatchConsumer`)."""

    def __init__(self) -> None:
        self._tokens: dict[int, str] = {}
        self._spans: dict[int, Any] = {}  # message id -> its process span, ended by the ack
        self._steps: dict[int, int] = {}  # workflow steps' ids: their workflows (AckItem.workflow_id)
        self._lock = threading.Lock()

    def remember(self, deliveries: Sequence[Delivery]) -> None:
        spans = {d.id: tracing.start_process_span(d.topic, d.id, d.attempt, d.trace_context) for d in deliveries}
        with self._lock:
            self._tokens.update((d.id, d.lease_token) for d in deliveries)
            for d in deliveries:
                self._steps.pop(d.id, None)
            self._steps.update((d.id, d.workflow_id) for d in deliveries if d.workflow_id is not None)
            # A message pulled again (its earlier lease expired unacknowledged) ends its old span.
            replaced = [self._spans[i] for i in spans if i in self._spans]
            self._spans.update((i, span) for i, span in spans.items() if span is not None)
        for span in replaced:
            tracing.end_process_span(span, "the lease expired before an ack", "abandoned")

    @contextlib.contextmanager
    def processing(self, msg_id: int) -> Iterator[Any]:
        """The message's process span, current for the block."""
        self.token(msg_id)  # a message pulled elsewhere is an error, as for ack
        with self._lock:
            span = self._spans.get(msg_id)
        with tracing.use_span(span):
            yield span

    def token(self, msg_id: int) -> str:
        """The lease token of a pulled message; MalformedRequestError when it was not pulled here."""
        with self._lock:
            if msg_id not in self._tokens:
                raise MalformedRequestError(f"message {msg_id} was not pulled by this consumer")
            return self._tokens[msg_id]

    def items(self, succeeded: Sequence[int], failed: Union[Sequence[int], Mapping[int, str]],
              results: Optional[Mapping[int, Any]] = None) -> list[AckItem]:
        """The AckItems for these outcomes (failed may map ids to error texts; results map
        succeeded ids to their return values)."""
        errors = dict(failed) if isinstance(failed, Mapping) else {i: "failed" for i in failed}
        stray = [i for i in (results or {}) if i not in set(succeeded)]
        if stray:
            raise MalformedRequestError(f"results name message {stray[0]}, which is not among the succeeded ids")
        texts = {i: encode_result(value) for i, value in (results or {}).items()}
        with self._lock:
            unknown = [i for i in list(succeeded) + list(errors) if i not in self._tokens]
            if unknown:
                raise MalformedRequestError(f"message {unknown[0]} was not pulled by this consumer")
            steps = self._steps
            items = [AckItem(i, self._tokens[i], True, result=texts.get(i), workflow=i in steps,
                             workflow_id=steps.get(i)) for i in succeeded]
            return items + [AckItem(i, self._tokens[i], False, e, workflow=i in steps, workflow_id=steps.get(i))
                            for i, e in errors.items()]

    def result(self, items: Sequence[AckItem], outcomes: Sequence[AckOutcome]) -> AckResult:
        """Forget the acknowledged leases; say which outcomes were applied and which were stale."""
        with self._lock:
            for item in items:
                self._tokens.pop(item.id, None)
                self._steps.pop(item.id, None)
            spans = [(self._spans.pop(item.id, None), item, outcome) for item, outcome in zip(items, outcomes)]
        for span, item, outcome in spans:
            tracing.end_process_span(span, None if item.success else (item.error or "failed"),
                                     "applied" if outcome is AckOutcome.APPLIED else "stale")
        applied = [it.id for it, o in zip(items, outcomes) if o is AckOutcome.APPLIED]
        stale = [it.id for it, o in zip(items, outcomes) if o is not AckOutcome.APPLIED]
        return AckResult(applied, stale)


def _default_client() -> BrokerLink:
    from . import _default

    return _default()
