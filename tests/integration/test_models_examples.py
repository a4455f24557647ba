"""The example workers (one per model, what ``tidemq dev`` runs) work on the embedded setup:
SQLite and in-process coordination."""

from __future__ import annotations

import importlib
import sys

from tests.observe import count
from tests.servers import wait_until
from tidemq import Worker
from tidemq.consumer import registered_consumers
from tidemq.message import MessageType


def test_each_example_model_runs_under_tidemq_dev(tmp_path):
    from tidemq_cli.embedded import embedded
    from tidemq_examples import MODULES

    # Declared on import; the registry is emptied between tests, so import afresh.
    modules = [importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
               for name in MODULES]
    specs = registered_consumers()
    assert {spec.type for spec in specs} == set(MessageType)  # one example per model
    broker, client = embedded(str(tmp_path / "dev.sqlite3"))
    worker = Worker(specs, client=client).start()
    try:
        orders = client.produce_many("example.order.close", [{"order_id": i} for i in range(20)])
        client.produce_many("example.ledger", [{"amount": a} for a in (5, -2, 10)])
        hooks = client.produce_many("example.webhook", [{"url": f"u{i % 2}", "event": i} for i in range(40)])
        cache = next(m for m in modules if m.__name__.endswith("cache"))
        ledger = next(m for m in modules if m.__name__.endswith("ledger"))
        wait_until(lambda: len(client.coordinator.consumers("example.cache.refresh")) == 1, 10, what="cache online")
        client.broadcast("example.cache.refresh", {"key": "users"})
        wait_until(lambda: count(broker.storage, "example.order.close", "SUCCESS") == len(orders), 30, what="orders")
        wait_until(lambda: count(broker.storage, "example.ledger", "SUCCESS") == 3, 30, what="ledger entries")
        wait_until(lambda: "users" not in cache.cache, 10, what="cache key dropped")
        assert ledger.balance["total"] == 13
        wait_until(lambda: count(broker.storage, "example.webhook", "SUCCESS") == len(hooks), 30, what="webhooks")
        webhooks = next(m for m in modules if m.__name__.endswith("webhooks"))
        assert webhooks.delivered == {"u0": 20, "u1": 20}  # the async def handler ran each once
    finally:
        worker.stop()
        client.close()
        broker.stop(grace=1)
