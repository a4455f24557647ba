"""The handler wrapper: layers around every run, the outcome decided once and passed to metrics."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timezone

import prometheus_client
import pytest

from tidemq import logs
from tidemq.handling import HandlerWrapper, Run, deciding, in_log_context, in_span, measured
from tidemq.lifecycle import HandlerOutcome


def _count(kind: str, topic: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(f"tidemq_messages_{kind}_total", {"topic": topic}) or 0.0


def _run(topic: str, retry_remaining: int) -> Run:
    return Run(7, topic, 2, "", datetime.now(timezone.utc), retry_remaining)


def _wrapper(seen: list, failures: list) -> HandlerWrapper:
    """The QueueRunner's layers, with a probe at each end that records what it sees."""

    def probe(name: str):
        @contextlib.contextmanager
        def layer(run: Run):
            seen.append(f"{name} in")
            try:
                yield
            except Exception as exc:
                seen.append(f"{name} saw {type(exc).__name__}")
                raise
            finally:
                seen.append(f"{name} out: {run.outcome}")
        return layer

    def report(run: Run) -> None:  # logged by the runner: inside the message's log context
        failures.append((run.error_text, logs._CURRENT.get()))

    return HandlerWrapper([probe("outer"), measured, in_log_context, deciding(report), in_span, probe("inner")])


@pytest.mark.parametrize("retry_remaining, outcome, counter", [(2, HandlerOutcome.RETRY, "retried"),
                                                               (0, HandlerOutcome.FAIL, "failed")])
def test_a_failed_run_is_decided_once_from_its_retries_and_counted_so(retry_remaining, outcome, counter):
    topic = f"u.handling.{counter}"
    seen, failures = [], []
    before = _count(counter, topic)

    def handler() -> None:
        raise ValueError("no stock")

    run = _run(topic, retry_remaining)
    assert _wrapper(seen, failures).run(run, handler) is outcome
    assert run.outcome is outcome and run.error_text == "ValueError: no stock"
    assert seen == ["outer in", "inner in", "inner saw ValueError", "inner out: None", f"outer out: {outcome}"]
    assert failures == [("ValueError: no stock", (7, topic, ""))]
    assert _count(counter, topic) == before + 1 and _count("succeeded", topic) == 0


def test_a_run_that_returns_is_a_success_for_every_layer():
    topic = "u.handling.ok"
    seen, failures = [], []
    run = _run(topic, 0)
    assert _wrapper(seen, failures).run(run, lambda: None) is HandlerOutcome.SUCCESS
    assert seen == ["outer in", "inner in", "inner out: success", "outer out: success"]
    assert failures == [] and run.error is None and _count("succeeded", topic) == 1


def test_an_async_run_goes_through_the_same_layers_in_its_task():
    topic = "u.handling.async"
    seen, failures = [], []

    async def handler() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("late")

    run = _run(topic, 1)
    assert asyncio.run(_wrapper(seen, failures).run_async(run, handler)) is HandlerOutcome.RETRY
    assert seen[-1] == "outer out: retry" and failures == [("RuntimeError: late", (7, topic, ""))]
    assert _count("retried", topic) == 1


def test_a_cancelled_async_run_has_no_outcome_and_is_not_counted():
    topic = "u.handling.cancelled"

    async def handler() -> None:
        raise asyncio.CancelledError()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_wrapper([], []).run_async(_run(topic, 1), handler))
    assert sum(_count(kind, topic) for kind in ("succeeded", "retried", "failed")) == 0


def test_without_a_deciding_layer_the_handlers_exception_is_raised_on():
    with pytest.raises(KeyError):
        HandlerWrapper([in_log_context, in_span]).run(_run("u.handling.raw", 0), lambda: {}["x"])
