"""Every bad input gets its own error naming the limit; gRPC says INVALID_ARGUMENT; nothing is
stored from a rejected batch and the broker stays up."""

from __future__ import annotations

import grpc
import pytest

from tidemq import MessageType, mq_consumer
from tidemq.errors import (
    DataTooLargeError,
    InvalidDataError,
    InvalidDelayError,
    InvalidMessageTypeError,
    InvalidRetryError,
    InvalidTopicError,
)
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.rpc import tidemq_pb2_grpc as pb_grpc


@pytest.fixture
def stub(broker):
    channel = grpc.insecure_channel(broker.address)
    yield pb_grpc.BrokerStub(channel)
    channel.close()


def stored(broker):
    return sum(n for counts in broker.storage.counts.count_by_status().values() for n in counts.values())


@pytest.mark.parametrize("topic, error, words", [
    ("", InvalidTopicError, "non-empty"),
    ("t" * 256, InvalidTopicError, "limit is 255"),
    ("bad topic!", InvalidTopicError, "characters outside"),
])
def test_client_refuses_bad_topics(client, topic, error, words):
    with pytest.raises(error, match=words):
        client.produce(topic, {})


def test_client_refuses_bad_data_delay_retry_and_type(client):
    with pytest.raises(InvalidDataError, match="JSON-serialisable"):
        client.produce("t.ok", {"x": object()})
    with pytest.raises(DataTooLargeError, match="limit is 1048576 bytes"):
        client.produce("t.ok", "x" * (1024 * 1024))
    with pytest.raises(InvalidDelayError, match="between 0"):
        client.produce("t.ok", 1, delay=-1)
    with pytest.raises(InvalidDelayError, match="10 years"):
        client.produce("t.ok", 1, delay=11 * 365 * 86400)
    with pytest.raises(InvalidRetryError, match="'soon'"):
        client.produce("t.ok", 1, retry=["soon"])
    with pytest.raises(InvalidMessageTypeError, match="expected one of QUEUE, SERIAL_QUEUE, TOPIC"):
        mq_consumer("t.ok", type="FANOUT")
    assert mq_consumer("t.ok", type="serial_queue") and MessageType.parse("topic") is MessageType.TOPIC


def test_produce_many_with_one_bad_item_stores_none(client, broker):
    datas = [{"n": i} for i in range(9)] + [{"bad": {1, 2}}]
    with pytest.raises(InvalidDataError, match="message #9"):
        client.produce_many("t.batch", datas)
    assert stored(broker) == 0


def _invalid(call, request, error_name):
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())["tidemq-error"] == error_name
    return info.value.details()


def test_broker_refuses_a_batch_with_one_bad_message_and_stores_none(stub, broker):
    good = [pb.NewMessage(topic="t.raw", data="1") for _ in range(5)]
    bad = good[:3] + [pb.NewMessage(topic="no spaces allowed", data="1")] + good[3:]
    details = _invalid(stub.Produce, pb.ProduceRequest(messages=bad), "InvalidTopicError")
    assert details.startswith("message #3:")
    assert stored(broker) == 0
    assert len(stub.Produce(pb.ProduceRequest(messages=good), timeout=10).ids) == 5


@pytest.mark.parametrize("message, error, words", [
    (pb.NewMessage(topic="t", data="{not json"), "InvalidDataError", "valid JSON"),
    (pb.NewMessage(topic="t", data="1", delay_seconds=-0.5), "InvalidDelayError", "between 0"),
    (pb.NewMessage(topic="t", data="1", delay_seconds=float("nan")), "InvalidDelayError", "between 0"),
    (pb.NewMessage(topic="t", data="1", effect_time_ms=4102444800000 * 10), "InvalidDelayError", "10 years"),
    (pb.NewMessage(topic="t", data="1", retry=-7), "InvalidRetryError", "between 0 and 1000"),
    (pb.NewMessage(topic="t", data="1", retry_schedule=[1, -1]), "InvalidRetryError", "between 0"),
    (pb.NewMessage(topic="t", data="1", unique_key="k" * 300), "MalformedRequestError", "limit is 255"),
    (pb.NewMessage(topic="t" * 300, data="1"), "InvalidTopicError", "limit is 255"),
    (pb.NewMessage(topic="t", data="1", trace_context="not-a-traceparent"), "MalformedRequestError", "W3C traceparent"),
    (pb.NewMessage(topic="t", data="1", trace_context="00-" + "a" * 300), "MalformedRequestError", "at most 255"),
])
def test_broker_refuses_malformed_fields(stub, broker, message, error, words):
    details = _invalid(stub.Produce, pb.ProduceRequest(messages=[message]), error)
    assert words in details
    assert stored(broker) == 0


def test_broker_enforces_its_own_data_limit(settings, mysql_url):
    from dataclasses import replace

    from tidemq_broker.server import BrokerServer

    server = BrokerServer(replace(settings, max_data_bytes=1000)).start()
    try:
        channel = grpc.insecure_channel(server.address)
        details = _invalid(pb_grpc.BrokerStub(channel).Produce,
                           pb.ProduceRequest(messages=[pb.NewMessage(topic="t", data='"' + "x" * 1200 + '"')]),
                           "DataTooLargeError")
        assert "limit is 1000 bytes" in details
        channel.close()
    finally:
        server.stop(grace=1)


def test_a_request_over_the_brokers_receive_limit_is_an_input_error_naming_it(settings, mysql_url):
    from dataclasses import replace

    from tidemq import Client
    from tidemq.errors import MalformedRequestError
    from tidemq_broker.server import BrokerServer

    server = BrokerServer(replace(settings, max_request_bytes=1 << 20)).start()
    client = Client(replace(settings, zk_hosts="", brokers=(server.address,), rpc_timeout=5))
    try:
        with pytest.raises(MalformedRequestError, match=r"over the limit of 1,048,576 bytes per call"):
            client.produce_many("t.limit", ["x" * 600_000, "y" * 600_000])
        assert stored(server) == 0
        assert len(client.produce_many("t.limit", ["x" * 400_000, "y" * 400_000])) == 2  # the same broker, at once
    finally:
        client.close()
        server.stop(grace=1)


@pytest.mark.parametrize("call, request_, words", [
    ("Produce", pb.ProduceRequest(), "at least one"),
    ("Produce", pb.ProduceRequest(messages=[pb.NewMessage(topic="t", data="1")] * 10001), "limit is 10000"),
    ("Pull", pb.PullRequest(topic="t", max_messages=0, total=1), "max_messages"),
    ("Pull", pb.PullRequest(topic="t", max_messages=5, rank=3, total=2), "rank must be in [0, total)"),
    ("Pull", pb.PullRequest(topic="t", max_messages=5, total=1, wait_seconds=1e9), "wait_seconds"),
    ("Pull", pb.PullRequest(topic="t", max_messages=5, total=1, ahead_seconds=11),
     "ahead_seconds must be between 0 and 10"),
    ("Pull", pb.PullRequest(topic="t", max_messages=5, total=1, ahead_seconds=float("nan")), "ahead_seconds"),
    ("Ack", pb.AckRequest(consumer="c"), "at least one"),
    ("Ack", pb.AckRequest(items=[pb.AckItem(id=-4)]), "positive message ids"),
    ("Cancel", pb.CancelRequest(ids=[0]), "positive message ids"),
    ("Touch", pb.TouchRequest(id=1, ttr_seconds=0), "ttr_seconds"),
    ("Requeue", pb.RequeueRequest(), "either ids or a topic"),
    ("Pull", pb.PullRequest(topic="t", max_messages=1, total=1, lease_token="not-hex"), "32 lowercase hex"),
    ("Release", pb.ReleaseRequest(lease_token="A" * 32), "32 lowercase hex"),
])
def test_malformed_requests_are_refused(stub, call, request_, words):
    details = _invalid(getattr(stub, call), request_, "MalformedRequestError")
    assert words in details


def test_garbage_bytes_and_unknown_enum_values_do_not_hurt_the_broker(broker, stub):
    channel = grpc.insecure_channel(broker.address)
    raw = channel.unary_unary("/tidemq.v1.Broker/Produce", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
    for garbage in (b"\xff\xfe\x00garbage", b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256))):
        with pytest.raises(grpc.RpcError) as info:
            raw(garbage, timeout=10)
        assert info.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT,
                                     grpc.StatusCode.UNKNOWN)
    # An AckReply-style unknown enum value in a request field is just an int to proto3: the
    # broker must still answer sensibly.
    channel.close()
    assert stub.Produce(pb.ProduceRequest(messages=[pb.NewMessage(topic="t.after", data="{}")]), timeout=10).ids


def _produce_raw(stub, **message):
    return stub.Produce(pb.ProduceRequest(messages=[pb.NewMessage(topic="bad.raw", retry=-1, **message)]), timeout=10)


@pytest.mark.parametrize("data, words", [
    ("[NaN, Infinity]", "no NaN or Infinity"),
    ('{"a": -Infinity}', "no NaN or Infinity"),
    ("[" * 100_000 + "]" * 100_000, "deeper than 64 levels"),
    ("[" * 65 + "]" * 65, "deeper than 64 levels"),
])
def test_data_that_is_not_strict_json_or_nests_too_deep_is_invalid_argument(stub, broker, data, words):
    with pytest.raises(grpc.RpcError) as info:
        _produce_raw(stub, data=data)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()
    assert stored(broker) == 0
    assert _produce_raw(stub, data="[" * 64 + "]" * 64).ids  # the limit itself is accepted


def test_an_effect_time_beyond_any_date_is_invalid_argument(stub, broker):
    for ms in (2 ** 62, 2 ** 63 - 1):
        with pytest.raises(grpc.RpcError) as info:
            _produce_raw(stub, data="1", effect_time_ms=ms)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "10 years" in info.value.details()
    assert stored(broker) == 0


def test_a_produce_without_a_deadline_is_answered_and_stored_once(broker):
    channel = grpc.insecure_channel(broker.address)
    try:
        reply = pb_grpc.BrokerStub(channel).Produce(pb.ProduceRequest(
            messages=[pb.NewMessage(topic="bad.nodeadline", data="1", retry=-1)], request_id="no-deadline-1"))
        assert len(reply.ids) == 1
        assert broker.storage.counts.count_by_status("bad.nodeadline") == {"bad.nodeadline": {"NEW": 1}}
    finally:
        channel.close()


@pytest.mark.parametrize("ttr", [float("nan"), float("inf"), -1.0, 1e300])
def test_touch_with_a_ttr_that_is_not_a_sane_number_is_invalid_argument(stub, ttr):
    with pytest.raises(grpc.RpcError) as info:
        stub.Touch(pb.TouchRequest(id=1, lease_token="0" * 32, ttr_seconds=ttr), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_client_refuses_nan_and_deep_data_before_sending(client):
    with pytest.raises(InvalidDataError, match="JSON"):
        client.produce("bad.client", [float("nan")])
    deep: list = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(InvalidDataError, match="deeper than 64 levels"):
        client.produce("bad.client", deep)


@pytest.mark.parametrize("field", ["name", "topic", "cron", "timezone", "missed", "data"])
def test_a_huge_schedule_field_is_invalid_argument_every_time_with_a_short_message(stub, broker, field):
    """A default gRPC client refuses replies with more than 8 KiB of trailers, at random between
    8 and 16 KiB: an error that echoed a 10,000-character field arrived as RESOURCE_EXHAUSTED."""
    fields = {"name": "huge", "topic": "t.huge", "cron": "* * * * *", "timezone": "UTC", "missed": "once",
              "data": "null"}
    fields[field] = "x" * 10_000
    for _ in range(10):
        with pytest.raises(grpc.RpcError) as info:
            stub.PutSchedule(pb.PutScheduleRequest(retry=-1, **fields), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        details = info.value.details()
        assert len(details) < 400 and "x" * 61 not in details, details
    assert broker.storage.schedules.get_schedule("huge") is None


def test_a_huge_request_id_is_quoted_with_its_length(stub, broker):
    details = _invalid(stub.Produce, pb.ProduceRequest(
        messages=[pb.NewMessage(topic="t", data="1")], request_id="y" * 10_000), "MalformedRequestError")
    assert len(details) < 400 and "(10,000 characters)" in details
    assert stored(broker) == 0
