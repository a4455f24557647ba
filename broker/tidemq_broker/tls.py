"""TLS for a broker's port, from the files the settings name."""

from __future__ import annotations

from typing import Optional

import grpc

from tidemq.config import Settings
from tidemq.tls import read_pem

__all__ = ["server_credentials"]


def server_credentials(settings: Settings) -> Optional[grpc.ServerCredentials]:
    """None (plaintext) unless TIDEMQ_TLS_CERT and TIDEMQ_TLS_KEY are set; with
    TIDEMQ_TLS_CLIENT_CA as well, clients must present a certificate that CA signed."""
    if not settings.tls_cert:
        return None
    key = read_pem(settings.tls_key, "TIDEMQ_TLS_KEY")
    cert = read_pem(settings.tls_cert, "TIDEMQ_TLS_CERT")
    client_ca = read_pem(settings.tls_client_ca, "TIDEMQ_TLS_CLIENT_CA") if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(((key, cert),), root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)
