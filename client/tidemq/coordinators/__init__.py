"""Implementations of :class:`tidemq.coordinator.Coordinator`."""
