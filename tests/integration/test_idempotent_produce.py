"""A Produce call names itself with a request id; a retry of a committed call, on the same broker
or another one, gets the ids of the first answer and stores nothing."""

from __future__ import annotations

import grpc
import pytest

from tidemq.rpc import tidemq_pb2 as pb
from tidemq.rpc import tidemq_pb2_grpc as pb_grpc
from tidemq_broker.server import BrokerServer


@pytest.fixture
def two_brokers(settings, broker):
    second = BrokerServer(settings).start()
    channels = [grpc.insecure_channel(b.address) for b in (broker, second)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    yield stubs, broker.storage
    for channel in channels:
        channel.close()
    second.stop(grace=1)


def _request(request_id, n=3, topic="t.idem"):
    return pb.ProduceRequest(request_id=request_id,
                             messages=[pb.NewMessage(topic=topic, data=f'{{"n": {i}}}') for i in range(n)])


def test_a_retry_on_another_broker_gets_the_first_answer_and_stores_nothing(two_brokers):
    (first, second), storage = two_brokers
    answer = list(first.Produce(_request("call-1"), timeout=10).ids)
    assert list(second.Produce(_request("call-1"), timeout=10).ids) == answer  # the retry, elsewhere
    assert list(first.Produce(_request("call-1"), timeout=10).ids) == answer  # and on the same broker
    assert storage.counts.count_by_status("t.idem") == {"t.idem": {"NEW": 3}}
    other = list(second.Produce(_request("call-2"), timeout=10).ids)
    assert not set(other) & set(answer)
    assert storage.counts.count_by_status("t.idem") == {"t.idem": {"NEW": 6}}


def test_calls_without_a_request_id_are_not_deduplicated(two_brokers):
    (first, _), storage = two_brokers
    first.Produce(_request("", 2, "t.idem.none"), timeout=10)
    first.Produce(_request("", 2, "t.idem.none"), timeout=10)
    assert storage.counts.count_by_status("t.idem.none") == {"t.idem.none": {"NEW": 4}}


@pytest.mark.parametrize("request_id, words", [
    ("x" * 65, "request_id must be 1-64 characters"),
    ("no spaces", "request_id must be 1-64 characters"),
])
def test_a_malformed_request_id_is_refused_and_nothing_is_stored(two_brokers, request_id, words):
    (first, _), storage = two_brokers
    with pytest.raises(grpc.RpcError) as caught:
        first.Produce(_request(request_id, 1, "t.idem.bad"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in caught.value.details()
    assert storage.counts.count_by_status("t.idem.bad") == {}


def test_a_request_id_reused_for_a_different_call_is_refused(two_brokers):
    (first, second), storage = two_brokers
    first.Produce(_request("call-9", 3, "t.idem.reuse"), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        second.Produce(_request("call-9", 2, "t.idem.reuse"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already used for a Produce call of 3 messages" in caught.value.details()
    assert storage.counts.count_by_status("t.idem.reuse") == {"t.idem.reuse": {"NEW": 3}}


def test_the_client_names_every_produce_call(client, broker):
    seen = []
    original = client.pool.call

    def spy(method, request, *args, **kwargs):
        if method == "Produce":
            seen.append(request.request_id)
        return original(method, request, *args, **kwargs)

    client.pool.call = spy
    client.produce("t.idem.client", 1)
    client.produce_many("t.idem.client", [2, 3])
    assert len(seen) == 2 and len(set(seen)) == 2 and all(len(r) == 32 for r in seen)


def test_only_the_produce_connections_take_several_statements_in_one_string(mysql_url):
    from pymysql.constants import CLIENT
    from sqlalchemy.exc import DBAPIError

    from tests.sqldb import open_sql

    storage, db = open_sql(mysql_url)
    try:
        with db.engine.connect() as conn:  # the console's and every other path's
            assert not conn.connection.dbapi_connection.client_flag & CLIENT.MULTI_STATEMENTS
            with pytest.raises(DBAPIError):
                conn.exec_driver_sql("SELECT 1; SELECT 2")  # a stacked statement is a syntax error here
        with db.produce_engine.connect() as conn:
            assert conn.connection.dbapi_connection.client_flag & CLIENT.MULTI_STATEMENTS
    finally:
        storage.close()
