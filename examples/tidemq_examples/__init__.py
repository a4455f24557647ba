"""Runnable examples, one module per message model; ``tidemq dev`` runs them all.

Run one against a cluster with ``tidemq worker tidemq_examples.orders`` and produce with
``python -m tidemq_examples.produce``.
"""

#: Every example module, for ``tidemq dev`` and ``tidemq worker``.
MODULES = ["tidemq_examples.orders", "tidemq_examples.ledger", "tidemq_examples.cache", "tidemq_examples.webhooks"]
