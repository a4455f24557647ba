"""Certificates for the TLS tests, made with the ``cryptography`` package: a CA, a broker
certificate for 127.0.0.1 and localhost, and client certificates."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Authority", "Pair"]


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: str
    key: str


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class Authority:
    """A certificate authority in ``directory`` (``ca.pem``) that signs server and client pairs."""

    def __init__(self, directory: Path, name: str = "tidemq test CA") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._name = subject
        self._cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(minutes=5))
                      .not_valid_after(now + datetime.timedelta(days=2))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.ca = str(self.dir / "ca.pem")
        Path(self.ca).write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _issue(self, name: str, usage, sans: list) -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(self._name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return Pair(str(cert_path), str(key_path))

    def server(self, name: str = "broker") -> Pair:
        """A broker certificate valid for 127.0.0.1 and localhost."""
        return self._issue(name, ExtendedKeyUsageOID.SERVER_AUTH,
                           [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])

    def client(self, name: str = "client") -> Pair:
        """A client certificate (for mutual TLS)."""
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, [])
