"""What the security tests share: a certificate authority (and a rogue one), the storage to make
principals in, and clients of one broker."""

from __future__ import annotations

import pytest

from tests.pki import Authority
from tidemq import Client, clock
from tidemq_broker.auth import new_token, token_hash
from tidemq_broker.storages import open_storage

__all__ = ["pki", "store", "client_of", "principal"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = Authority(tmp_path_factory.mktemp("pki"))
    return ca, ca.server(), ca.client(), Authority(tmp_path_factory.mktemp("rogue"), "rogue CA")


@pytest.fixture
def store(settings):
    storage = open_storage(settings.db_url)
    yield storage
    storage.close()


def client_of(broker, **settings_fields):
    from tidemq import Settings

    return Client(Settings.from_env({}, brokers=(broker.address,), rpc_timeout=2, **settings_fields))


def principal(store, name, role, topics=("orders.*",)):
    token = new_token()
    store.principals.add(name, role, tuple(topics), token_hash(token), clock.now())
    return token
