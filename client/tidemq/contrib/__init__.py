"""Integrations with frameworks, each an optional extra (``tidemq.contrib.django``: ``tidemq[django]``)."""
