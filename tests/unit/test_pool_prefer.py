"""A call that prefers a broker goes there while it is live and fails over when it is not: a
step's inputs are read from the broker that leased it (``tidemq.inputs``). Real gRPC servers
stand in for brokers."""

from __future__ import annotations

from tests.unit.test_pool_errors import REQUEST, FakeBroker, _ok
from tidemq.pool import BrokerPool


def test_a_preferred_broker_takes_every_call_while_live_and_another_one_answers_once_it_is_gone():
    first, second = FakeBroker(_ok), FakeBroker(_ok)
    pool = BrokerPool((first.address, second.address))
    try:
        for _ in range(4):
            assert list(pool.call("Produce", REQUEST, 5, prefer=second.address).ids) == [7]
        assert (first.calls, second.calls) == (0, 4)
        for _ in range(4):  # without a preference: round robin
            pool.call("Produce", REQUEST, 5)
        assert (first.calls, second.calls) == (2, 6)
        second.stop()
        assert list(pool.call("Produce", REQUEST, 5, prefer=second.address).ids) == [7]
        assert first.calls == 3
        # An address that is not a registered broker is never called.
        assert list(pool.call("Produce", REQUEST, 5, prefer="127.0.0.1:1").ids) == [7]
        assert first.calls == 4
    finally:
        pool.close()
        first.stop()
        second.stop()
