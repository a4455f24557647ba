"""The tidemq benchmark suite: ``python -m benchmarks --help``.

Every scenario starts its own servers (MariaDB, ZooKeeper, Redis), measures the raw limit or the
peer on the same machine in the same run, and reports tidemq's figure as a ratio to it.
"""
