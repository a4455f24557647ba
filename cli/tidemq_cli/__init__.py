"""The ``tidemq`` command: the composition root that may import every tidemq package."""
