"""Transactional enqueue: an order and its delayed ``example.order.close`` in one transaction.

The order row and the message that will close it if unpaid commit together or not at all: no
order without its close, and no close of an order that was never stored. ``orders.close_order``
handles the message. Run it against tidemq's database (``TIDEMQ_DB_URL``)::

    python -m tidemq_examples.checkout "a book"
"""

from __future__ import annotations

import sys

from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, create_engine, insert

import tidemq

#: How long an order may stay unpaid before it is closed (seconds).
PAYMENT_WINDOW = 30 * 60

metadata = MetaData()
orders = Table("example_order", metadata,
               Column("id", Integer, primary_key=True, autoincrement=True),
               Column("item", String(200), nullable=False),
               Column("status", String(20), nullable=False))


def place_order(conn: Connection, item: str) -> tuple[int, int]:
    """Store an order and schedule its close, in the caller's transaction: (order id, message id)."""
    if not item.strip():
        raise ValueError("an order needs an item")
    order_id = conn.execute(insert(orders).values(item=item, status="unpaid")).inserted_primary_key[0]
    message_id = tidemq.enqueue(conn, "example.order.close", {"order_id": order_id}, delay=PAYMENT_WINDOW,
                                unique_key=f"order-close-{order_id}")
    return order_id, message_id


def main(argv: list[str]) -> int:
    engine = create_engine(tidemq.Settings.from_env().db_url)
    metadata.create_all(engine)
    with engine.begin() as conn:  # commits both, or rolls both back on any error
        order_id, message_id = place_order(conn, " ".join(argv) or "a book")
    print(f"order {order_id} placed; message {message_id} closes it in {PAYMENT_WINDOW // 60} minutes unless paid")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
