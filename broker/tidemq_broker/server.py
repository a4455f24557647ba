"""A broker process: the gRPC server and everything it runs, started and stopped in order."""

from __future__ import annotations

import ipaddress
import logging
import socket
from concurrent import futures
from typing import Optional, Sequence

import grpc

from tidemq import clock
from tidemq.config import Settings
from tidemq.coordinator import Coordinator
from tidemq.coordinators import open_coordinator
from tidemq.rpc import tidemq_pb2_grpc as pb_grpc

from . import metrics
from .auth import Principals, TokenInterceptor
from .cancels import cancel_signals
from .errors import ConfigurationError
from .hints import MARGIN
from .maintenance import Maintainer
from .maintenance.backlog import BacklogRefresh
from .maintenance.counts import TopicCounts
from .maintenance.edges import EdgeRetention
from .maintenance.broadcasts import BroadcastPruner
from .maintenance.leases import LeaseExpiry
from .maintenance.requests import ProduceRequests
from .maintenance.results import ResultRetention
from .maintenance.retention import Retention
from .maintenance.schedules import ScheduleTicks
from .release_signals import ReleaseSignals
from .results import ResultHub
from .pulls import PullHub
from .migrations import warn_if_behind
from .produce_streams import ProduceStreams
from .service import ERROR_KEY, BrokerService
from .storage import NewRow, Storage
from .storages import open_storage
from .tls import server_credentials
from .topics import TopicCache
from .writer import GroupCommitWriter

__all__ = ["BrokerServer", "MAX_MESSAGE_BYTES"]

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # largest reply: a pull of many large messages


class BrokerServer:
    """Owns one broker's gRPC server, writer, pull hub and maintenance campaign.

    ``port=0`` picks a free port; ``address`` is then the advertised host:port. ``workers``
    bounds concurrent RPCs: each waiting long-poll holds one, so size it above the number of
    consumer threads you expect plus room for producers.
    """

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 0,
                 advertise: Optional[str] = None, storage: Optional[Storage] = None,
                 coordinator: Optional[Coordinator] = None, workers: int = 256,
                 create_schema: bool = True, insecure: bool = False) -> None:
        if settings.auth == "none" and not insecure and not _loopback(host):
            # Protected mode: an open broker on a reachable address lets anyone produce, pull,
            # cancel and requeue. Saying so takes one flag; doing it by accident takes none.
            raise ConfigurationError(
                f"refusing to serve on {host} without authentication: anyone who reaches the port could "
                "produce, pull, cancel and requeue. Set TIDEMQ_AUTH=token (principals from `tidemq auth add`), "
                "or pass --insecure to serve it open anyway")
        credentials = server_credentials(settings)  # read before anything is opened: a bad file leaks nothing
        self.settings = settings
        self.create_schema = create_schema
        self.storage = storage or open_storage(settings.db_url)
        self._own_storage = storage is None
        self.storage.dependencies.watch_workflows(metrics.workflows_finished)
        self.coordinator = coordinator or open_coordinator(settings.zk_hosts, settings.zk_root,
                                                           settings.zk_session_timeout, auth=settings.zk_auth)
        self._own_coordinator = coordinator is None
        interceptors = []
        options = [("grpc.max_receive_message_length", settings.max_request_bytes),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.so_reuseport", 0)]
        if settings.auth == "token":
            interceptors.append(TokenInterceptor(Principals(self.storage.principals), ERROR_KEY))
            # The interceptor reads a request only once its token is accepted. Until then a call
            # may send ahead what its HTTP/2 stream window allows: 64 KiB, unless bandwidth
            # probing grows the window of a busy connection (to megabytes per stream, measured
            # on loopback), which would let anonymous streams park that much each. A read still
            # opens the window to the message it takes, so large authenticated requests flow.
            options.append(("grpc.http2.bdp_probe", 0))
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidemq-rpc"),
            interceptors=interceptors,
            options=options,
            maximum_concurrent_rpcs=workers * 4,
        )
        if credentials is None:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        else:
            self.port = self._server.add_secure_port(f"{host}:{port}", credentials)
        self.tls = credentials is not None
        if settings.auth == "token" and not self.tls and not _loopback(host):
            log.warning("tokens are sent in clear text on %s: set TIDEMQ_TLS_CERT and TIDEMQ_TLS_KEY", host)
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.address = advertise or f"{_advertised_host(host)}:{self.port}"
        self.topics = TopicCache(self.storage.topics)
        self.hub = PullHub(self.storage.probes)
        self.results = ResultHub(self.storage.probes)
        self.writer = GroupCommitWriter(self.storage.messages, self.topics, self.address, self.hub.notify_commit,
                                        pulls=self.hub)
        self.signals = ReleaseSignals(self.coordinator, self._signalled, self.address)
        # An open Produce stream holds a server thread: a quarter of them at most.
        self.cancel_signals = cancel_signals(self.coordinator)
        self.service = BrokerService(self.storage, self.topics, self.writer, self.hub, self.address,
                                     settings.max_data_bytes, self.results, self.signals,
                                     ProduceStreams(limit=max(1, workers // 4)), self.cancel_signals)
        pb_grpc.add_BrokerServicer_to_server(self.service, self._server)
        self.maintainer = Maintainer(self.coordinator, self.address, [
            LeaseExpiry(self.storage.leases, self.address, self.service.reopened, self._max_deliveries),
            Retention(self.storage.topics, self.storage.messages),
            ResultRetention(self.storage.topics, self.storage.messages),
            EdgeRetention(self.storage.dependencies),
            ProduceRequests(self.storage.messages),
            BroadcastPruner(self.coordinator),
            BacklogRefresh(self.storage.counts, self.address),
            TopicCounts(self.storage.counts),
            ScheduleTicks(self.storage.schedules, self._produce_ticks, self._default_retry),
        ])

    def _max_deliveries(self, topic: str) -> int:
        return self.topics.get(topic).max_deliveries

    def _produce_ticks(self, rows: Sequence[NewRow]) -> list[int]:
        # Through the group commit, as a Produce call's rows: the hub wakes waiting pulls.
        return self.writer.write(rows, 30.0)

    def _default_retry(self, topic: str) -> int:
        return self.topics.get(topic).retry_count

    def _signalled(self, topic: str, untimed: bool) -> None:
        """A signal of ``topic`` from another broker or the console (``release_signals.py``)."""
        if untimed:  # due at times not known: the locks read from the start until the next probe
            self.hub.hints.forget([topic])
        # A step another broker released is due from that broker's "now": ours less the margin
        # its clock may differ by, or the shards' cursors could stay above it until the probe.
        self.hub.notify(topic, clock.after(clock.now(), -MARGIN), None)

    def start(self) -> "BrokerServer":
        """Start serving, then announce the broker so clients only find it ready."""
        if self.create_schema:
            self.storage.schema.create_schema()
        self.storage.schema.ping()
        warn_if_behind(self.storage.schema, "broker")
        self.hub.start()
        self.results.start()
        self.signals.start()
        self.cancel_signals.start()
        self._server.start()
        if self._own_coordinator:
            self.coordinator.start()
        self.coordinator.register_broker(self.address)
        self.maintainer.start()
        log.info("broker %s serving", self.address)
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Leave discovery, refuse new calls, finish running ones, commit queued produces."""
        self.coordinator.unregister_broker(self.address)
        self.maintainer.stop()
        self.hub.stop()
        self.results.stop()
        self.signals.stop()
        self.cancel_signals.stop()
        self.service.streams.stop()
        done = self._server.stop(grace)
        done.wait(grace + 1)
        self.writer.stop()
        if self._own_coordinator:
            self.coordinator.stop()
        if self._own_storage:
            self.storage.close()
        log.info("broker %s stopped", self.address)

    def wait(self) -> None:
        self._server.wait_for_termination()


def _loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _advertised_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return host
