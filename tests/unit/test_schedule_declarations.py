"""``@mq_consumer(..., schedule=...)``: what a declaration records and what it refuses."""

from __future__ import annotations

import pytest

from tidemq import MessageType, Worker, mq_consumer
from tidemq.consumer import registered_consumers
from tidemq.coordinators.local import LocalCoordinator
from tidemq.errors import ConfigurationError
from tidemq.stub import StubBroker


def test_the_spec_carries_the_schedule_and_its_zone():
    @mq_consumer("sched.unit", schedule="*/5 * * * *", schedule_timezone="Europe/Berlin")
    def handle(message):
        pass

    [spec] = registered_consumers()
    assert (spec.schedule, spec.schedule_timezone) == ("*/5 * * * *", "Europe/Berlin")


@pytest.mark.parametrize("kwargs, match", [
    ({"schedule": "  "}, "cron expression"),
    ({"schedule": "* * * * *", "type": MessageType.TOPIC}, "broadcasts"),
])
def test_declarations_that_cannot_work_are_refused(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        mq_consumer("sched.unit", **kwargs)


def test_a_worker_without_a_client_cannot_declare_and_starts_nothing():
    @mq_consumer("sched.unit", schedule="* * * * *")
    def handle(message):
        pass

    worker = Worker(link=StubBroker(), coordinator=LocalCoordinator())
    with pytest.raises(ConfigurationError, match="needs a Client"):
        worker.start()
    assert worker.runners == []
