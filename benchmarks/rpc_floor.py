"""The gRPC floor: one empty Produce round trip to a Python gRPC server that writes nothing.

``python -m benchmarks.rpc_floor PORT_FILE`` serves the tidemq Broker service with a Produce and
a ProduceStream that answer at once (same generated stubs, same sync server as a broker).
``latency(samples)`` starts it, times single calls from this process, then single requests on
one open stream (each answered before the next is sent, as a client's stream carries them), and
stops it: what a produce costs on this machine before the broker touches the database. A single
produce() cannot be cheaper than the stream's figure plus the raw commit; the produce scenario
prints that sum beside the measured figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent import futures

__all__ = ["latency"]


def latency(samples: int) -> tuple[list[float], list[float]]:
    """Milliseconds per empty Produce call and per empty request on an open ProduceStream,
    ``samples`` of each after a warm-up."""
    import queue

    import grpc

    from tidemq.rpc import tidemq_pb2 as pb
    from tidemq.rpc import tidemq_pb2_grpc as pb_grpc

    from .env import wait_until

    with tempfile.TemporaryDirectory(prefix="tidemq-rpc-floor-") as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.rpc_floor", port_file])
        try:
            wait_until(lambda: os.path.exists(port_file) and os.path.getsize(port_file) > 0, 30, 0.05,
                       "rpc floor server")
            with open(port_file) as fh:
                channel = grpc.insecure_channel(f"127.0.0.1:{fh.read().strip()}")
            stub = pb_grpc.BrokerStub(channel)
            request = pb.ProduceRequest(messages=[pb.NewMessage(topic="bench.floor", data='{"i": 0}')])
            for _ in range(50):
                stub.Produce(request, timeout=10)
            times = []
            for _ in range(samples):
                began = time.perf_counter()
                stub.Produce(request, timeout=10)
                times.append((time.perf_counter() - began) * 1000)
            requests: queue.SimpleQueue = queue.SimpleQueue()
            replies = stub.ProduceStream(iter(requests.get, None))
            streamed = []
            for k in range(50 + samples):
                began = time.perf_counter()
                requests.put(request)
                next(replies)
                if k >= 50:
                    streamed.append((time.perf_counter() - began) * 1000)
            requests.put(None)
            channel.close()
            return times, streamed
        finally:
            proc.kill()
            proc.wait(10)


def _serve(port_file: str) -> None:
    import grpc

    from tidemq.rpc import tidemq_pb2 as pb
    from tidemq.rpc import tidemq_pb2_grpc as pb_grpc

    class Empty(pb_grpc.BrokerServicer):
        def Produce(self, request, context):  # noqa: N802 (the generated name)
            return pb.ProduceReply(ids=[1] * len(request.messages))

        def ProduceStream(self, requests, context):  # noqa: N802
            for request in requests:
                yield pb.ProduceReply(ids=[1] * len(request.messages))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_BrokerServicer_to_server(Empty(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    server.wait_for_termination()


if __name__ == "__main__":
    _serve(sys.argv[1])
