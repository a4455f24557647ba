"""One trace from the producer's request to every attempt of its handler, through a real broker
on MariaDB and ZooKeeper: spans for produce, the Produce RPC and its group commit, the lock and
each handler run, recorded by the SDK's in-memory exporter."""

from __future__ import annotations

import threading

from opentelemetry import trace

from tests.otel import exporter, hex_trace
from tests.servers import wait_until
from tidemq import Message, MessageType, Worker, tracing
from tidemq.consumer import ConsumerSpec


def test_one_trace_runs_from_the_producer_to_each_handler_attempt(client, broker):
    spans = exporter()
    spans.clear()
    attempts: list[int] = []
    done = threading.Event()

    def handler(message: Message) -> None:
        attempts.append(message.attempt)
        if len(attempts) == 1:
            raise RuntimeError("fails once")
        done.set()

    spec = ConsumerSpec("traced.orders", MessageType.QUEUE, handler, threads=1, ttr=30, batch=1)
    worker = Worker([spec], client=client, drain_timeout=5).start()
    try:
        wait_until(lambda: client.coordinator.consumers("traced.orders"), 10, what="consumer registration")
        with trace.get_tracer("app").start_as_current_span("checkout") as parent:
            msg_id = client.produce("traced.orders", {"order": 1}, retry=[0.1])
        assert done.wait(20), f"attempts so far: {attempts}"
    finally:
        worker.stop()
    stored = broker.storage.reads.get_message(msg_id)
    assert tracing.trace_id_of(stored.trace_context) == format(parent.get_span_context().trace_id, "032x")
    assert stored.trace != "" and stored.trace_context not in stored.trace  # the two are not mixed up

    finished = spans.get_finished_spans()
    want = format(parent.get_span_context().trace_id, "032x")
    by_name: dict[str, list] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    [send] = by_name["send traced.orders"]
    [rpc] = by_name["tidemq.v1.Broker/Produce"]
    [commit] = by_name["tidemq group commit"]
    locks = by_name["lock traced.orders"]
    handled = sorted(by_name["process traced.orders"], key=lambda s: s.attributes["tidemq.message.attempt"])

    assert send.parent.span_id == parent.get_span_context().span_id
    assert send.kind is trace.SpanKind.PRODUCER and send.attributes["messaging.message.id"] == str(msg_id)
    assert rpc.parent.span_id == send.context.span_id and rpc.kind is trace.SpanKind.SERVER
    assert commit.parent.span_id == rpc.context.span_id
    assert commit.attributes["messaging.batch.message_count"] == 1
    assert len(locks) == 2 and len(handled) == 2  # one lock and one handler span per attempt
    for span in locks + handled:
        assert span.parent.span_id == send.context.span_id
        assert span.attributes["messaging.message.id"] == str(msg_id)
        assert span.attributes["messaging.system"] == "tidemq"
        assert span.attributes["messaging.destination.name"] == "traced.orders"
    assert [s.attributes["tidemq.message.attempt"] for s in handled] == [1, 2]
    assert handled[0].status.status_code is trace.StatusCode.ERROR
    assert handled[1].status.status_code is trace.StatusCode.UNSET
    assert {hex_trace(s) for s in [send, rpc, commit, *locks, *handled]} == {want}


def test_a_batch_lock_links_each_message_s_trace(client, broker):
    spans = exporter()
    spans.clear()
    tracer = trace.get_tracer("app")
    ids = []
    for n in range(3):
        with tracer.start_as_current_span(f"request-{n}"):
            ids.append(client.produce("traced.batch", {"n": n}))
    leased = client.pull("traced.batch", "c1", max_messages=10, wait=1)
    assert sorted(d.id for d in leased) == sorted(ids)
    assert len({tracing.trace_id_of(d.trace_context) for d in leased}) == 3
    [lock] = [s for s in spans.get_finished_spans() if s.name == "lock traced.batch"]
    assert lock.parent is None and lock.attributes["messaging.batch.message_count"] == 3
    assert {format(link.context.trace_id, "032x") for link in lock.links} == \
        {tracing.trace_id_of(d.trace_context) for d in leased}


def test_a_message_produced_outside_any_span_still_starts_a_trace(client, broker):
    exporter().clear()
    msg_id = client.produce("traced.root", {})
    [delivery] = client.pull("traced.root", "c1", max_messages=1, wait=1)
    assert delivery.id == msg_id and tracing.trace_id_of(delivery.trace_context)


def test_a_batch_consumer_makes_a_process_span_per_message_from_pull_to_ack(client, broker):
    from tidemq import BatchConsumer

    spans = exporter()
    spans.clear()
    tracer = trace.get_tracer("app")
    sends = {}
    for n in range(2):
        with tracer.start_as_current_span(f"request-{n}") as request:
            sends[client.produce("traced.batchjob", {"n": n})] = request.get_span_context().trace_id
    consumer = BatchConsumer("traced.batchjob", ttr=30, client=client)
    batch = consumer.pull(max_messages=10, wait=2)
    assert sorted(m.id for m in batch) == sorted(sends)
    good, bad = sorted(batch, key=lambda m: m.id)
    with consumer.processing(good):
        with tracer.start_as_current_span("render"):
            pass
    assert not [s for s in spans.get_finished_spans() if s.name == "process traced.batchjob"], \
        "a process span ended before its ack"
    result = consumer.ack(succeeded=[good.id], failed={bad.id: "ValueError: no such customer"})
    assert sorted(result.applied) == sorted(sends)

    finished = spans.get_finished_spans()
    send_of = {s.attributes["messaging.message.id"]: s for s in finished if s.name == "send traced.batchjob"}
    processed = {s.attributes["messaging.message.id"]: s for s in finished if s.name == "process traced.batchjob"}
    assert set(processed) == {str(good.id), str(bad.id)}
    for msg_id, span in processed.items():
        assert span.kind is trace.SpanKind.CONSUMER
        assert span.parent.span_id == send_of[msg_id].context.span_id  # the producer's trace, as a handler's
        assert span.context.trace_id == sends[int(msg_id)]
        assert span.attributes["tidemq.ack.outcome"] == "applied"
    assert processed[str(good.id)].status.status_code is trace.StatusCode.UNSET
    assert processed[str(bad.id)].status.status_code is trace.StatusCode.ERROR
    assert processed[str(bad.id)].status.description == "ValueError: no such customer"
    [render] = [s for s in finished if s.name == "render"]
    assert render.parent.span_id == processed[str(good.id)].context.span_id
