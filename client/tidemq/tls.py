"""TLS material for gRPC channels, read from the files the settings name."""

from __future__ import annotations

from typing import Optional

import grpc

from .config import Settings
from .errors import ConfigurationError

__all__ = ["channel_credentials", "read_pem"]


def read_pem(path: str, setting: str) -> bytes:
    """The PEM file at ``path``; ``ConfigurationError`` naming ``setting`` when it is unreadable
    or holds no PEM block (the content is never echoed: it may be a private key)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigurationError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigurationError(f"{setting}: {path} is not a PEM file (no -----BEGIN line)")
    return data


def channel_credentials(settings: Settings) -> Optional[grpc.ChannelCredentials]:
    """TLS for a client's channels: None (plaintext) unless TIDEMQ_TLS_CA or a client
    certificate is set. The broker is verified against TIDEMQ_TLS_CA (the system's roots when
    only a client certificate is given); the certificate and key, when set, are presented to a
    broker that asks for them (mutual TLS)."""
    if not settings.tls_ca and not settings.tls_cert:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(settings.tls_ca, "TIDEMQ_TLS_CA") if settings.tls_ca else None,
        private_key=read_pem(settings.tls_key, "TIDEMQ_TLS_KEY") if settings.tls_key else None,
        certificate_chain=read_pem(settings.tls_cert, "TIDEMQ_TLS_CERT") if settings.tls_cert else None,
    )
