"""The coordinators every coordination conformance module runs against."""

from __future__ import annotations

import pytest

from tidemq.coordinators.local import LocalCoordinator
from tidemq.coordinators.zookeeper import ZooKeeperCoordinator

ROOT = "/tidemq"


@pytest.fixture(params=["local", "zookeeper"])
def coordinators(request):
    """``make()`` returns a started coordinator; all made in one test share one tree."""
    made = []
    hosts = request.getfixturevalue("zk_hosts") if request.param == "zookeeper" else ""

    def make(start: bool = True, listener=None):
        coord = ZooKeeperCoordinator(hosts, ROOT, session_timeout=4.0) if hosts else LocalCoordinator(ROOT)
        if listener is not None:
            coord.add_state_listener(listener)
        if start:
            coord.start()
        made.append(coord)
        return coord

    make.kind = request.param
    make.hosts = hosts
    yield make
    for coord in reversed(made):
        coord.stop()
