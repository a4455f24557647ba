"""Integration fixtures live in tests/conftest.py; the process helpers in tests/processes.py."""

from tests.processes import TIDEMQ, process_env, start_broker_process  # noqa: F401
