"""Malformed and hostile requests straight at a broker process's gRPC port: each gets a clear
error, nothing is stored from them, and the broker stays up."""

from __future__ import annotations

import threading

import grpc

from tests.processes import process_env, start_broker_process
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.rpc import tidemq_pb2_grpc as pb_grpc
from tidemq_broker.storages import open_storage


def _raw(channel, method):
    return channel.unary_unary(f"/tidemq.v1.Broker/{method}", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)


def test_hostile_requests_leave_the_broker_serving(settings, spawn, tmp_path):
    proc, address = start_broker_process(spawn, tmp_path, process_env(settings))
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 200 * 1024 * 1024)])
    stub = pb_grpc.BrokerStub(channel)
    storage = open_storage(settings.db_url)
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def expect_error(call, request):
        try:
            call(request, timeout=30)
        except grpc.RpcError as exc:
            with lock:
                codes.append(exc.code())
            return exc
        raise AssertionError("a hostile request was accepted")

    def garbage_storm(seed):
        for n in range(40):
            method = ("Produce", "Pull", "Ack", "Cancel", "Touch", "Requeue")[(seed + n) % 6]
            payload = bytes((seed * 31 + n * 7 + i) % 256 for i in range(1 + (n * 13) % 300))
            expect_error(_raw(channel, method), b"\x0a\xff\xff\xff\xff\x0f" + payload)

    try:
        storms = [threading.Thread(target=garbage_storm, args=(s,)) for s in range(6)]
        for t in storms:
            t.start()
        # Wrong wire types: field 1 (topic, a string) sent as a varint, field 2 as a fixed64.
        expect_error(_raw(channel, "Produce"), b"\x08\x96\x01\x11" + b"\x00" * 8)
        # Huge: a 70 MB request is over the broker's 64 MB limit.
        huge = pb.ProduceRequest(messages=[pb.NewMessage(topic="t", data='"' + "x" * (70 * 1024 * 1024) + '"')])
        assert expect_error(stub.Produce, huge).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Many huge-but-allowed fields: 10,001 messages is one too many.
        too_many = pb.ProduceRequest(messages=[pb.NewMessage(topic="t.many", data="1")] * 10001)
        assert "limit is 10000" in expect_error(stub.Produce, too_many).details()
        # Numbers out of range and not numbers at all.
        for request in (pb.PullRequest(topic="t", max_messages=-5, total=1),
                        pb.PullRequest(topic="t", max_messages=1, total=1, wait_seconds=float("nan")),
                        pb.PullRequest(topic="t", max_messages=1, total=-1),
                        pb.PullRequest(topic="t", max_messages=1, total=1, ttr_seconds=float("inf"))):
            assert expect_error(stub.Pull, request).code() == grpc.StatusCode.INVALID_ARGUMENT
        for t in storms:
            t.join(120)
        assert len(codes) == 6 * 40 + 7
        assert grpc.StatusCode.OK not in codes

        # Unknown fields (from a newer client, or junk) are ignored by proto3: the message is fine.
        known = pb.ProduceRequest(messages=[pb.NewMessage(topic="t.unknown", data="{}")]).SerializeToString()
        reply = pb.ProduceReply.FromString(_raw(channel, "Produce")(known + b"\xf8\x06\x2a", timeout=10))
        assert len(reply.ids) == 1
        # The largest batch allowed is stored whole, and the broker is still serving.
        ids = stub.Produce(pb.ProduceRequest(messages=[pb.NewMessage(topic="t.many", data="1")] * 10000),
                           timeout=60).ids
        assert len(ids) == 10000 and len(set(ids)) == 10000
        assert proc.poll() is None, "the broker process died"
        assert storage.counts.count_by_status() == {"t.unknown": {"NEW": 1}, "t.many": {"NEW": 10000}}
    finally:
        channel.close()
        storage.close()
