"""Implementations of :class:`tidemq_broker.storage.Storage`."""
