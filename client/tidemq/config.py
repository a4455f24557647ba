"""Configuration: read from the environment in this one place, overridable by arguments."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Mapping, Optional

from .errors import ConfigurationError, quote
from .heap import GC_MODES
from .logs import LOG_FORMATS
from .validation import DEFAULT_MAX_DATA_BYTES

__all__ = ["Settings", "DEFAULT_DB_URL", "DEFAULT_ZK_ROOT", "MAX_REQUEST_BYTES", "has_password", "masked_url"]

DEFAULT_DB_URL = "sqlite:///tidemq-dev.sqlite3"
DEFAULT_ZK_ROOT = "/tidemq"
#: The largest request a broker reads by default and a client sends: a big produce_many batch.
MAX_REQUEST_BYTES = 64 * 1024 * 1024
MIN_REQUEST_BYTES = 64 * 1024
AUTH_MODES = ("none", "token")
#: TIDEMQ_PRODUCE: through a broker's Produce RPC, or committed by the producing process itself.
PRODUCE_PATHS = ("broker", "unary", "direct")
_TOKEN = re.compile(r"tmq_[A-Za-z0-9_-]{20,200}")


@dataclass(frozen=True)
class Settings:
    """Every setting tidemq reads; ``Settings.from_env()`` is the only reader of the environment.

    db_url: SQLAlchemy URL of the message store (TIDEMQ_DB_URL, or the first line of the file
    TIDEMQ_DB_URL_FILE; default a SQLite file). Shown only through ``masked_url``.
    zk_hosts: ZooKeeper connection string (TIDEMQ_ZK_HOSTS); empty means in-process coordination.
    zk_root: the ZooKeeper path under which tidemq keeps its nodes (TIDEMQ_ZK_ROOT).
    brokers: static broker addresses (TIDEMQ_BROKERS) used instead of ZooKeeper discovery.
    max_data_bytes: the largest message data a broker accepts (TIDEMQ_MAX_DATA_BYTES).
    max_request_bytes: the largest request a broker reads, a whole produce_many batch
    (TIDEMQ_MAX_REQUEST_BYTES, 64 KiB to 64 MiB). With ``auth="token"`` a broker reads none of
    it before the caller's token is accepted.
    zk_session_timeout: seconds before ZooKeeper drops a silent process's nodes
    (TIDEMQ_ZK_SESSION_TIMEOUT): lower means faster takeover of a dead worker's share.
    produce_in_flight: Produce RPCs a client keeps open at once (TIDEMQ_PRODUCE_IN_FLIGHT);
    concurrent produce() calls beyond it share the next RPC (see ``tidemq.coalesce``).
    produce_path: how a client stores what it produces (TIDEMQ_PRODUCE): "broker" (the default:
    requests to a broker on long-lived Produce streams, ``tidemq.produce_stream``), "unary" (a
    Produce call per request, for proxies that do not carry long-lived streams) or "direct" (the
    process commits into the database at ``db_url``
    itself, with the brokers' checks and group commit: ``tidemq_broker.direct``; no tokens or
    topic grants apply, the database credentials are the permission).
    tls_cert, tls_key: PEM files of this process's certificate and key (TIDEMQ_TLS_CERT,
    TIDEMQ_TLS_KEY): a broker serves TLS with them; a client presents them to a broker that
    asks for client certificates.
    tls_ca: PEM file of the CA a client trusts to sign brokers' certificates (TIDEMQ_TLS_CA);
    set, the client speaks TLS and verifies the broker.
    tls_client_ca: PEM file of the CA whose client certificates a broker requires
    (TIDEMQ_TLS_CLIENT_CA): mutual TLS.
    token: the secret a client sends to brokers that authenticate (TIDEMQ_TOKEN, or the first
    line of the file TIDEMQ_TOKEN_FILE). Never shown by ``repr``.
    auth: what a broker requires of callers (TIDEMQ_AUTH): "none", or "token" (every call
    carries a token of a principal made with ``tidemq auth add``).
    zk_auth: ZooKeeper digest credentials ``user:password`` (TIDEMQ_ZK_AUTH); set, tidemq's nodes
    are writable only with them and readable by all. Masked by ``repr``.
    metrics_port: HTTP port of this process's Prometheus endpoint (TIDEMQ_METRICS_PORT; the CLI's
    ``--metrics-port`` on broker, worker and admin); 0 serves none.
    metrics_host: interface that endpoint listens on (TIDEMQ_METRICS_HOST, default 127.0.0.1).
    log_format: how the command line's processes write log lines (TIDEMQ_LOG_FORMAT): "text",
    or "json" for one JSON object per line (``tidemq.logs``).
    otel_exporters: where ``tidemq broker`` and ``tidemq worker`` send spans
    (``tidemq.tracing_env``), from OpenTelemetry's standard variables: OTEL_TRACES_EXPORTER
    ("otlp", "console", a comma list of them, or "none"); when it is unset, "otlp" if
    OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, else none;
    OTEL_SDK_DISABLED=true turns it off. The SDK reads the rest itself (OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and _ARG, the exporter's endpoint and headers).
    otel_protocol: the OTLP transport (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
    OTEL_EXPORTER_OTLP_PROTOCOL): "grpc" (the default, which the otel extra installs) or
    "http/protobuf" (needs opentelemetry-exporter-otlp-proto-http).
    Both are checked only where spans are exported (``tidemq.tracing_env.configure``): an
    application that sets up its own SDK may name exporters tidemq does not know.
    gc: what ``tidemq broker`` and ``tidemq worker`` do with Python's cycle collector once
    started (TIDEMQ_GC): "settled" (the default: start-up's objects frozen out of collections,
    ``tidemq.heap``) or "python" (left as Python sets it).
    """

    db_url: str = field(default=DEFAULT_DB_URL, repr=False)
    zk_hosts: str = ""
    zk_root: str = DEFAULT_ZK_ROOT
    brokers: tuple[str, ...] = field(default_factory=tuple)
    admin_user: str = ""
    admin_password: str = field(default="", repr=False)
    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES
    max_request_bytes: int = MAX_REQUEST_BYTES
    rpc_timeout: float = 10.0
    zk_session_timeout: float = 10.0
    produce_in_flight: int = 2
    produce_path: str = "broker"
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_client_ca: str = ""
    token: str = field(default="", repr=False)
    auth: str = "none"
    zk_auth: str = field(default="", repr=False)
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_format: str = "text"
    otel_exporters: tuple[str, ...] = field(default_factory=tuple)
    otel_protocol: str = "grpc"
    gc: str = "settled"

    def __repr__(self) -> str:
        # Secrets are left out (repr=False) or masked: the URL and ZooKeeper credentials show
        # who, never the password; tokens and the console password not at all.
        shown = [f"db_url={masked_url(self.db_url)!r}"]
        shown += [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr]
        if self.zk_auth:
            shown.append(f"zk_auth={self.zk_auth.partition(':')[0] + ':***'!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, **overrides: object) -> "Settings":
        """Build settings from ``env`` (default ``os.environ``), then apply non-None overrides."""
        env = os.environ if env is None else env
        try:
            max_bytes = int(env.get("TIDEMQ_MAX_DATA_BYTES", DEFAULT_MAX_DATA_BYTES))
            max_request = int(env.get("TIDEMQ_MAX_REQUEST_BYTES", "") or MAX_REQUEST_BYTES)
            rpc_timeout = float(env.get("TIDEMQ_RPC_TIMEOUT", 10.0))
            session_timeout = float(env.get("TIDEMQ_ZK_SESSION_TIMEOUT", 10.0))
            in_flight = int(env.get("TIDEMQ_PRODUCE_IN_FLIGHT", 2))
            metrics_port = int(env.get("TIDEMQ_METRICS_PORT", "") or 0)
        except ValueError as exc:
            raise ConfigurationError(
                "TIDEMQ_MAX_DATA_BYTES / TIDEMQ_MAX_REQUEST_BYTES / TIDEMQ_RPC_TIMEOUT / TIDEMQ_ZK_SESSION_TIMEOUT "
                "/ TIDEMQ_PRODUCE_IN_FLIGHT / TIDEMQ_METRICS_PORT "
                f"must be numbers: {exc}") from None
        settings = cls(
            db_url=(env.get("TIDEMQ_DB_URL", "") or _first_line(env.get("TIDEMQ_DB_URL_FILE", ""), "TIDEMQ_DB_URL_FILE")
                    or DEFAULT_DB_URL),
            zk_hosts=env.get("TIDEMQ_ZK_HOSTS", ""),
            zk_root=env.get("TIDEMQ_ZK_ROOT", "") or DEFAULT_ZK_ROOT,
            brokers=_split(env.get("TIDEMQ_BROKERS", "")),
            admin_user=env.get("TIDEMQ_ADMIN_USER", ""),
            admin_password=env.get("TIDEMQ_ADMIN_PASSWORD", ""),
            max_data_bytes=max_bytes,
            max_request_bytes=max_request,
            rpc_timeout=rpc_timeout,
            zk_session_timeout=session_timeout,
            produce_in_flight=in_flight,
            produce_path=(env.get("TIDEMQ_PRODUCE", "") or "broker").strip().lower(),
            tls_cert=env.get("TIDEMQ_TLS_CERT", ""),
            tls_key=env.get("TIDEMQ_TLS_KEY", ""),
            tls_ca=env.get("TIDEMQ_TLS_CA", ""),
            tls_client_ca=env.get("TIDEMQ_TLS_CLIENT_CA", ""),
            token=env.get("TIDEMQ_TOKEN", "") or _first_line(env.get("TIDEMQ_TOKEN_FILE", ""), "TIDEMQ_TOKEN_FILE"),
            auth=(env.get("TIDEMQ_AUTH", "") or "none").strip().lower(),
            zk_auth=env.get("TIDEMQ_ZK_AUTH", ""),
            metrics_port=metrics_port,
            metrics_host=env.get("TIDEMQ_METRICS_HOST", "") or "127.0.0.1",
            log_format=(env.get("TIDEMQ_LOG_FORMAT", "") or "text").strip().lower(),
            otel_exporters=_otel_exporters(env),
            otel_protocol=(env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
                           or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "") or "grpc").strip().lower(),
            gc=(env.get("TIDEMQ_GC", "") or "settled").strip().lower(),
        )
        clean = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(clean.get("brokers"), str):
            clean["brokers"] = _split(clean["brokers"])  # type: ignore[arg-type]
        settings = replace(settings, **clean)  # type: ignore[arg-type]
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ConfigurationError for values that cannot work."""
        if not self.zk_root.startswith("/") or self.zk_root.endswith("/") and self.zk_root != "/":
            raise ConfigurationError(f"TIDEMQ_ZK_ROOT must be an absolute path like /tidemq, got {quote(self.zk_root)}")
        if not 1 <= self.zk_session_timeout <= 600:
            raise ConfigurationError(
                f"TIDEMQ_ZK_SESSION_TIMEOUT must be between 1 and 600 seconds, got {self.zk_session_timeout}")
        if not 1 <= self.produce_in_flight <= 64:
            raise ConfigurationError(
                f"TIDEMQ_PRODUCE_IN_FLIGHT must be between 1 and 64, got {self.produce_in_flight}")
        if self.produce_path not in PRODUCE_PATHS:
            raise ConfigurationError(
                f"TIDEMQ_PRODUCE must be one of {', '.join(PRODUCE_PATHS)}, got {quote(self.produce_path)}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigurationError("TIDEMQ_TLS_CERT and TIDEMQ_TLS_KEY go together: set both files or neither")
        if self.auth not in AUTH_MODES:
            raise ConfigurationError(f"TIDEMQ_AUTH must be one of {', '.join(AUTH_MODES)}, got {quote(self.auth)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigurationError(
                f"TIDEMQ_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, got {quote(self.log_format)}")
        if self.gc not in GC_MODES:
            raise ConfigurationError(f"TIDEMQ_GC must be one of {', '.join(GC_MODES)}, got {quote(self.gc)}")
        if self.token and not _TOKEN.fullmatch(self.token):
            # The value is never echoed: it is a secret, even when malformed.
            raise ConfigurationError(
                "TIDEMQ_TOKEN is not a tidemq token (expected the tmq_... string `tidemq auth add` printed)")
        if not 1 <= self.max_data_bytes <= 16 * 1024 * 1024 - 1:
            raise ConfigurationError(
                f"TIDEMQ_MAX_DATA_BYTES must be between 1 and 16777215 (the column's limit), got {self.max_data_bytes}"
            )
        if not MIN_REQUEST_BYTES <= self.max_request_bytes <= MAX_REQUEST_BYTES:
            raise ConfigurationError(
                f"TIDEMQ_MAX_REQUEST_BYTES must be between {MIN_REQUEST_BYTES} and {MAX_REQUEST_BYTES} (64 MiB, "
                f"what clients send at most), got {self.max_request_bytes}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(
                "TIDEMQ_METRICS_PORT must be a TCP port (1-65535), or 0 or empty for no metrics, "
                f"got {self.metrics_port}")
        if self.zk_auth:
            user, colon, password = self.zk_auth.partition(":")
            if not (colon and user and password):
                # Never quote the value: it may be a password with its colon mistyped.
                raise ConfigurationError(
                    "TIDEMQ_ZK_AUTH (or --zk-auth-file) must be ZooKeeper digest credentials user:password, "
                    "both parts non-empty (the password may itself contain ':')")


def masked_url(url: str) -> str:
    """``url`` with the password of its user info replaced by ``***`` (for logs and messages)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, hosts = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hosts}"


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password in its user info."""
    return masked_url(url) != url


def _first_line(path: str, setting: str) -> str:
    """The first line of the file at ``path`` (a secret kept out of the environment and argv)."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip()
    except OSError as exc:
        raise ConfigurationError(f"{setting}: cannot read {path}: {exc.strerror}") from None


def _otel_exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """The span exporters OpenTelemetry's variables ask for (see ``Settings.otel_exporters``)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        return tuple(name for name in _split(named) if name != "none")
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return ("otlp",)
    return ()


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())
