"""QUEUE with a result: pricing an order off the web process; the caller waits for the price."""

from tidemq import Message, MessageType, mq_consumer

#: What a unit of each known item costs, in cents (a real app asks its pricing service).
PRICES = {"a book": 1250, "a pen": 180}


@mq_consumer("example.quote", type=MessageType.QUEUE)
def quote(message: Message) -> dict:
    """Price ``{"item": ..., "quantity": n}``; the return value is the message's result. An
    unknown item raises: the caller's ``result()`` re-raises it as ``RemoteError``."""
    item, quantity = message.data["item"], int(message.data.get("quantity", 1))
    if item not in PRICES:
        raise KeyError(f"no price for {item!r}")
    return {"item": item, "quantity": quantity, "total_cents": PRICES[item] * quantity}
