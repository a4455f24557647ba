"""Found by ``manage.py tidemq_worker`` because this app is installed."""

from tidemq import Message, mq_consumer

from .models import Order


@mq_consumer("order.close", threads=2, ttr=30)
def close_order(message: Message) -> None:
    Order.objects.filter(pk=message.data["order_id"], status="open").update(status="closed",
                                                                           close_message=message.id)
