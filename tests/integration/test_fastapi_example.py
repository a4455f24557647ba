"""examples/tidemq_examples/fastapi_app.py served by a real uvicorn process, called over HTTP
with httpx, producing through a real broker on MariaDB and ZooKeeper."""

from __future__ import annotations

import json
import signal
import sys
from datetime import timedelta

import httpx

from tests.observe import all_messages, count
from tests.processes import process_env
from tests.servers import free_port, wait_until
from tidemq import Client, MessageType, Worker
from tidemq.consumer import ConsumerSpec
from tidemq_examples import quotes
from tidemq_examples.fastapi_app import PAYMENT_WINDOW


def _serve(settings, spawn) -> tuple[object, str]:
    """The example app in its own uvicorn process, serving once it answers."""
    port = free_port()
    server = spawn("uvicorn", [sys.executable, "-m", "uvicorn", "tidemq_examples.fastapi_app:app",
                               "--host", "127.0.0.1", "--port", str(port)], process_env(settings))
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if server.poll() is not None:
            raise RuntimeError(server.log_path.read_text()[-3000:])
        try:
            return httpx.get(f"{base}/openapi.json", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, 30, 0.1, "uvicorn serving the app")
    return server, base


def test_the_fastapi_example_produces_cancels_and_sends_a_batch(settings, broker, spawn):
    server, base = _serve(settings, spawn)
    storage = broker.storage
    with httpx.Client(base_url=base, timeout=30) as http:
        placed = http.post("/orders", json={"item": "a book"})
        assert placed.status_code == 200, placed.text
        order = placed.json()
        [close] = all_messages(storage, "example.order.close")
        assert close.id == order["close_message"] and close.status == "NEW"
        assert json.loads(close.data) == {"order_id": order["order_id"], "item": "a book"}
        waits = close.effect_time - close.add_time
        assert timedelta(seconds=PAYMENT_WINDOW - 1) <= waits <= timedelta(seconds=PAYMENT_WINDOW + 1)

        paid = http.post(f"/orders/{order['order_id']}/paid", params={"close_message": close.id})
        assert paid.json() == {"order_id": order["order_id"], "cancelled": True}
        assert all_messages(storage, "example.order.close") == []
        again = http.post(f"/orders/{order['order_id']}/paid", params={"close_message": close.id})
        assert again.json()["cancelled"] is False

        queued = [http.post("/mails", json={"to": to, "text": "hello"}).json()["message"]
                  for to in ("a@example.com", "b@example.com", "nobody")]
        sent = http.post("/mails/send", params={"limit": 10}).json()
        assert sorted(sent["sent"]) == sorted(queued[:2]) and sent["failed"] == [queued[2]]
        assert count(storage, "example.mail", "SUCCESS") == 2
        [bad] = [m for m in all_messages(storage, "example.mail") if m.id == queued[2]]
        assert bad.status == "NEW" and bad.retry_remaining == 2  # failed once, retried later

        too_big = http.post("/mails", json={"to": "c@example.com", "text": "x" * (1024 * 1024 + 1)})
        assert too_big.status_code == 422
        assert too_big.json()["error"] == "DataTooLargeError" and "1048576" in too_big.json()["detail"]

    server.send_signal(signal.SIGTERM)
    # uvicorn ends by raising the signal it stopped for again, once the lifespan has closed.
    assert server.wait(30) in (0, -signal.SIGTERM)
    log = server.log_path.read_text()
    assert "Application shutdown complete" in log and "shutdown failed" not in log, log[-2000:]


def test_the_fastapi_example_awaits_a_workers_result_through_a_handle(settings, broker, spawn):
    server, base = _serve(settings, spawn)
    with httpx.Client(base_url=base, timeout=30) as http:
        asked = http.post("/quotes", json={"item": "a book", "quantity": 3}).json()["quote"]
        # No worker yet: the route answers that the quote is still pending once its wait ends.
        pending = http.get(f"/quotes/{asked}", params={"wait": 0.2})
        assert pending.status_code == 202 and pending.json() == {"quote": asked, "status": "pending"}
        unknown = http.post("/quotes", json={"item": "a lamp"}).json()["quote"]
        client = Client(settings)
        worker = Worker([ConsumerSpec("example.quote", MessageType.QUEUE, quotes.quote)], client=client).start()
        try:
            priced = http.get(f"/quotes/{asked}", params={"wait": 20})
            assert priced.status_code == 200, priced.text
            assert priced.json() == {"quote": asked,
                                     "price": {"item": "a book", "quantity": 3, "total_cents": 3 * 1250}}
            failed = http.get(f"/quotes/{unknown}", params={"wait": 20})
            assert failed.status_code == 422 and failed.json()["error"] == "KeyError"
            assert "no price for 'a lamp'" in failed.json()["detail"]
            missing = http.get("/quotes/999999999", params={"wait": 1})
            assert missing.status_code == 404 and missing.json()["error"] == "MessageNotFoundError"
        finally:
            worker.stop()
            client.close()
    server.send_signal(signal.SIGTERM)
    assert server.wait(30) in (0, -signal.SIGTERM)
