"""TLS on a real broker and MariaDB: plaintext and wrongly trusting clients are refused with a
clear error, mutual TLS needs a certificate the CA signed, unreadable files are refused naming
the setting, and a worker process consumes through TLS with a token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.integration.security_setup import client_of, pki, principal, store  # noqa: F401 (pki, store: fixtures)
from tests.servers import wait_until
from tidemq.errors import BrokerUnavailableError, ConfigurationError
from tidemq_broker.server import BrokerServer


def test_a_tls_broker_serves_verifying_clients_and_refuses_plaintext_and_untrusting_ones(settings, pki):
    ca, server, _, rogue = pki
    broker = BrokerServer(replace(settings, tls_cert=server.cert, tls_key=server.key)).start()
    clients = []
    try:
        good = client_of(broker, tls_ca=ca.ca)
        clients.append(good)
        assert good.produce("tls.t", {"n": 1}) > 0
        plain = client_of(broker)
        clients.append(plain)
        with pytest.raises(BrokerUnavailableError, match="TIDEMQ_TLS_CA"):
            plain.produce("tls.t", {"n": 2}, timeout=2)
        untrusting = client_of(broker, tls_ca=rogue.ca)
        clients.append(untrusting)
        with pytest.raises(BrokerUnavailableError, match="CERTIFICATE_VERIFY_FAILED.*TLS failed"):
            untrusting.produce("tls.t", {"n": 3}, timeout=2)
        assert broker.storage.counts.count_by_status("tls.t")["tls.t"] == {"NEW": 1}
    finally:
        for c in clients:
            c.close()
        broker.stop(grace=1)


def test_mutual_tls_requires_a_client_certificate_the_ca_signed(settings, pki):
    ca, server, client_pair, rogue = pki
    broker = BrokerServer(replace(settings, tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.ca)).start()
    rogue_pair = rogue.client("rogue-client")
    clients = []
    try:
        anonymous = client_of(broker, tls_ca=ca.ca)
        clients.append(anonymous)
        with pytest.raises(BrokerUnavailableError):
            anonymous.produce("mtls.t", 1, timeout=2)
        forged = client_of(broker, tls_ca=ca.ca, tls_cert=rogue_pair.cert, tls_key=rogue_pair.key)
        clients.append(forged)
        with pytest.raises(BrokerUnavailableError):
            forged.produce("mtls.t", 2, timeout=2)
        known = client_of(broker, tls_ca=ca.ca, tls_cert=client_pair.cert, tls_key=client_pair.key)
        clients.append(known)
        assert known.produce("mtls.t", 3) > 0
        assert broker.storage.counts.count_by_status("mtls.t")["mtls.t"] == {"NEW": 1}
    finally:
        for c in clients:
            c.close()
        broker.stop(grace=1)


def test_unreadable_tls_files_are_refused_naming_the_setting(settings, tmp_path):
    not_pem = tmp_path / "key.txt"
    not_pem.write_text("secret-material")
    with pytest.raises(ConfigurationError, match="TIDEMQ_TLS_KEY: .* is not a PEM file") as info:
        BrokerServer(replace(settings, tls_cert=str(not_pem), tls_key=str(not_pem)))
    assert "secret-material" not in str(info.value)
    with pytest.raises(ConfigurationError, match="TIDEMQ_TLS_KEY: cannot read"):
        BrokerServer(replace(settings, tls_cert=str(not_pem), tls_key=str(tmp_path / "missing.key")))


def test_a_worker_process_consumes_through_tls_with_a_token(settings, pki, store, spawn, tmp_path):
    from tests.integration.handlers_common import read_log
    from tests.processes import start_worker

    ca, server, _, _ = pki
    broker = BrokerServer(replace(settings, tls_cert=server.cert, tls_key=server.key, auth="token")).start()
    producer = client_of(broker, tls_ca=ca.ca, token=principal(store, "app", "producer", ["jobs.*"]),
                       zk_hosts=settings.zk_hosts)
    log = tmp_path / "runs.log"
    token_file = tmp_path / "worker.token"
    token_file.write_text(principal(store, "worker", "consumer", ["jobs.*"]) + "\n")
    env = {"TIDEMQ_DB_URL": "", "TIDEMQ_ZK_HOSTS": settings.zk_hosts, "TIDEMQ_BROKERS": broker.address,
           "TIDEMQ_TLS_CA": ca.ca, "TIDEMQ_TOKEN_FILE": str(token_file), "HANDLER_LOG": str(log),
           "HANDLER_TOPIC": "jobs.secure", "HANDLER_SLEEP": "0"}
    try:
        start_worker(spawn, "worker", "tests.integration.handlers_queue", env)
        wait_until(lambda: len(producer.coordinator.consumers("jobs.secure")) == 1, 30,
                   what="the worker registered")
        ids = producer.produce_many("jobs.secure", [{"n": n} for n in range(200)])
        wait_until(lambda: {e.id for e in read_log(log)} >= set(ids), 60, 0.1, "200 messages run")
        wait_until(lambda: store.counts.count_by_status("jobs.secure")["jobs.secure"] == {"SUCCESS": 200}, 30,
                   what="200 acks stored")
    finally:
        producer.close()
        broker.stop(grace=1)
