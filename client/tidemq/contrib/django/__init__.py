"""tidemq in a Django project (``pip install 'tidemq[django]'``).

>>> INSTALLED_APPS = [..., "tidemq.contrib.django"]                      # doctest: +SKIP
>>> TIDEMQ = {"ZK_HOSTS": "zk1:2181", "DATABASE": "default"}               # doctest: +SKIP

>>> from tidemq.contrib.django import enqueue                              # doctest: +SKIP
>>> with transaction.atomic():                                             # doctest: +SKIP
...     order = Order.objects.create(item="book")
...     enqueue("order.close", {"order_id": order.pk}, delay=1800)

Consumers are declared with ``@tidemq.mq_consumer`` in each app's ``consumers.py`` and run by
``python manage.py tidemq_worker`` (the options of ``tidemq worker``). See ``conf`` for the
settings and ``checks`` for what ``manage.py check`` reports.
"""

from __future__ import annotations

from .producing import client, enqueue, produce, send

__all__ = ["enqueue", "produce", "send", "client"]
