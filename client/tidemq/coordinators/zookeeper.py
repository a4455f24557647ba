"""The ZooKeeper coordinator (kazoo): the production implementation."""

from __future__ import annotations

import logging
import posixpath
import threading
from typing import Callable, Optional

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry

from ..coordinator import ConnectionState, Coordinator, Registration, sort_by_sequence
from ..errors import CoordinationError
from ..outage import Outage
from .zk_acl import hint as _hint
from .zk_acl import node_acl, secure_nodes
from .zk_broadcasts import ZkBroadcasts
from .zk_leader import ZkLeadership
from .zk_session import KazooLog, expire

__all__ = ["ZooKeeperCoordinator"]

log = logging.getLogger(__name__)
_STATES = {
    KazooState.CONNECTED: ConnectionState.CONNECTED,
    KazooState.SUSPENDED: ConnectionState.SUSPENDED,
    KazooState.LOST: ConnectionState.LOST,
}


_SUBPATHS = ("brokers", "consumers", "broadcast", "leader", "signals", "cancels")
#: The subpaths whose children persist (per-topic parents, the election); a broker's node under
#: ``brokers`` is ephemeral, made anew with the ACL by each session.
_PERSISTENT_PARENTS = tuple(sub for sub in _SUBPATHS if sub != "brokers")


class ZooKeeperCoordinator(Coordinator):
    """Coordination through ZooKeeper; ``hosts`` may carry a chroot (``h1:2181,h2:2181/app``).

    ``auth`` (``user:password``, TIDEMQ_ZK_AUTH) authenticates the session by digest and gives
    every node this coordinator creates the ACL of :func:`node_acl`, so processes without the
    credentials can read tidemq's nodes but not create, change or delete them.

    A lost connection is logged once (kazoo's warning per reconnection attempt is not), and so is
    its end. Nothing on the data path waits for ZooKeeper meanwhile: brokers serve, consumers
    pull on their last known ranks, the maintenance leader keeps leading until its session is
    known to be lost, and the broker pool keeps the last broker list.
    """

    def __init__(self, hosts: str, root: str = "/tidemq", session_timeout: float = 10.0, auth: str = "") -> None:
        self.hosts = hosts
        self.root = root.rstrip("/") or "/"
        self._acl = node_acl(auth)
        self._secured = bool(auth)
        self._kazoo_log = KazooLog()
        self._outage = Outage(log, "calls to ZooKeeper")
        # default_acl covers every create: ours, ensure_path/makepath's parents and the Election's.
        self._zk = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=5, max_delay=1.0, deadline=10.0),
            auth_data=[("digest", auth)] if auth else None,
            default_acl=self._acl,
            logger=self._kazoo_log,
        )
        self._listeners: list[Callable[[ConnectionState], None]] = []
        self._brokers: set[str] = set()
        self._consumers: list[Registration] = []
        self._node_session: dict[int, Optional[int]] = {}  # id(registration) -> session of its node
        self._lock = threading.Lock()
        self._create_lock = threading.RLock()
        self._session_lost = False
        self._closed = False
        self._zk.add_listener(self._on_state)
        self._broadcasts = ZkBroadcasts(self._zk, self._path("broadcast"), self._path("leader", "clock-"),
                                        self._delete, self._children_watch)
        self._leadership = ZkLeadership(self._zk, self._path("leader", "election"), self._listeners)

    # -- session ---------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> None:
        try:
            self._zk.start(timeout=timeout)
        except (KazooTimeoutError, KazooException) as exc:
            self._zk.stop()
            raise CoordinationError(f"cannot connect to ZooKeeper at {self.hosts} within {timeout} s: {exc}") from None
        try:
            for sub in _SUBPATHS:
                self._zk.ensure_path(self._path(sub))
            if self._secured:
                self._secure_existing()
        except NoAuthError:
            self._zk.stop()
            self._zk.close()
            raise CoordinationError(
                f"ZooKeeper refused to change tidemq's nodes under {self.root}: they are protected by "
                "other credentials. Set TIDEMQ_ZK_AUTH to the user:password that created them") from None

    def _secure_existing(self) -> None:
        """Give nodes made before TIDEMQ_ZK_AUTH was set (an upgrade) the ACL they lack: the root,
        its subpaths and their persistent children (per-topic parents, the election)."""
        paths = [self.root] + [self._path(sub) for sub in _SUBPATHS]
        for sub in _PERSISTENT_PARENTS:
            paths += [self._path(sub, child) for child in self._zk.get_children(self._path(sub))]
        secure_nodes(self._zk, paths, self._acl)

    def stop(self) -> None:
        self._closed = True
        with self._lock:
            brokers, self._brokers = set(self._brokers), set()
            consumers, self._consumers = list(self._consumers), []
        for address in brokers:
            self._delete(self._path("brokers", address))
        for reg in consumers:
            self._delete(self._path("consumers", reg.topic, reg.node))
        try:
            self._zk.stop()
            self._zk.close()
        except KazooException:  # already closed or never connected
            pass

    def add_state_listener(self, listener: Callable[[ConnectionState], None]) -> None:
        self._listeners.append(listener)

    def session_id(self) -> Optional[int]:
        """The current ZooKeeper session id (tests use it to expire the session)."""
        ident = self._zk.client_id
        return ident[0] if ident else None

    def expire_session(self, timeout: float = 30.0) -> None:
        """Fault injection: make ZooKeeper expire this session, as a long partition would.

        A second connection that joins the session and closes it ends it on the server; this
        client then sees LOST, reconnects with a new session and registers again. The join goes
        without the chroot (kazoo would check the path, and this client reconnecting can take
        the session back mid-check), and is repeated until this client holds a new session.
        """
        expire(self._zk, self.hosts, timeout)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: never block here, hand work to a thread.
        if state == KazooState.LOST:
            self._session_lost = True  # _restore says so when it makes the nodes again
        elif state == KazooState.SUSPENDED and not self._closed:
            self._outage.failed(CoordinationError(
                f"the connection to {self.hosts} was lost ({self._kazoo_log.reason or 'no reason given'}); brokers "
                "go on serving and consumers pulling on their last known ranks"))
        elif state == KazooState.CONNECTED:
            self._outage.succeeded()
            if self._session_lost:
                self._session_lost = False
                threading.Thread(target=self._restore, name="tidemq-zk-restore", daemon=True).start()
        for listener in list(self._listeners):
            try:
                listener(_STATES[state])
            except Exception:  # a listener's bug must not kill the connection thread
                log.exception("coordination state listener failed")

    def _restore(self) -> None:
        """After a lost session every ephemeral node is gone: make them again.

        Retried until done: a consumer without a node takes nothing (its rank is -1), so giving
        up would stop it for good. A registration already made in the current session (one that
        raced with the reconnect, or an earlier restore) is left alone, so none gets two nodes.
        """
        with self._lock:
            items: list[object] = [*self._brokers, *self._consumers]
        delay = 0.1
        for item in items:
            while not self._session_lost and not self._closed:
                session = self.session_id()
                with self._lock:
                    wanted = item in self._brokers or item in self._consumers
                    done = isinstance(item, Registration) and self._node_session.get(id(item)) == session
                if not wanted or done:
                    break
                try:
                    if isinstance(item, Registration):
                        with self._create_lock:
                            item._replace(self._create_consumer_node(item.topic, item.instance, item))
                        log.info("the ZooKeeper session expired: consumer of %s registered again as %s",
                                 item.topic, item.node)
                    else:
                        self._create_broker_node(str(item))
                    break
                except (CoordinationError, KazooException) as exc:
                    log.warning("registering again after a lost session failed (%r); retrying", exc)
                    threading.Event().wait(delay)
                    delay = min(delay * 2, 2.0)

    # -- brokers ---------------------------------------------------------------------------
    def register_broker(self, address: str) -> None:
        with self._lock:
            self._brokers.add(address)
        self._create_broker_node(address)

    def _create_broker_node(self, address: str) -> None:
        path = self._path("brokers", address)
        try:
            self._zk.create(path, b"", ephemeral=True, makepath=True)
        except NoAuthError as exc:
            raise CoordinationError(f"cannot register broker {address}: {exc!r}{_hint(exc)}") from None
        except NodeExistsError:
            # A broker restarted on the same address after kill -9: its old session's node
            # lingers until that session times out. It is ours to replace.
            stat = self._zk.exists(path)
            if stat is not None and stat.ephemeralOwner != self.session_id():
                self._delete(path)
                self._zk.create(path, b"", ephemeral=True, makepath=True)

    def unregister_broker(self, address: str) -> None:
        with self._lock:
            self._brokers.discard(address)
        self._delete(self._path("brokers", address))

    def watch_brokers(self, callback: Callable[[list[str]], None]) -> None:
        ChildrenWatch(self._zk, self._path("brokers"), lambda children: callback(sorted(children)))

    # -- consumers -------------------------------------------------------------------------
    def register_consumer(self, topic: str, instance: str) -> Registration:
        reg = Registration(topic, instance, "")
        with self._create_lock:  # one at a time, so the stray sweep never sees a sibling half-made
            reg._replace(self._create_consumer_node(topic, instance, reg))
            with self._lock:
                self._consumers.append(reg)
        return reg

    def _create_consumer_node(self, topic: str, instance: str, reg: Registration) -> str:
        session = self.session_id()
        try:
            path = self._zk.create(
                self._path("consumers", topic, instance + "-"), b"", ephemeral=True, sequence=True, makepath=True
            )
        except KazooException as exc:
            raise CoordinationError(f"cannot register consumer of {topic}: {exc!r}{_hint(exc)}") from None
        node = posixpath.basename(path)
        with self._lock:
            self._node_session[id(reg)] = session
            keep = {r.node for r in self._consumers if r.topic == topic} | {node}
        self._drop_strays(topic, instance, keep)
        return node

    def _drop_strays(self, topic: str, instance: str, keep: set[str]) -> None:
        # A create retried after a connection loss may have made a second node in our session:
        # it would hold a rank nobody serves (its shard stranded), so delete such strays.
        try:
            children = self._zk.get_children(self._path("consumers", topic))
        except KazooException:
            return
        mine = self.session_id()
        for child in children:
            if child in keep or not child.startswith(instance + "-"):
                continue
            try:
                stat = self._zk.exists(self._path("consumers", topic, child))
            except KazooException:
                continue
            if stat is not None and stat.ephemeralOwner == mine:
                log.warning("deleting stray consumer node %s of %s", child, topic)
                self._delete(self._path("consumers", topic, child))

    def unregister_consumer(self, registration: Registration) -> None:
        with self._lock:
            if registration in self._consumers:
                self._consumers.remove(registration)
            self._node_session.pop(id(registration), None)
        self._delete(self._path("consumers", registration.topic, registration.node))

    def consumers(self, topic: str) -> list[str]:
        try:
            return sort_by_sequence(self._zk.get_children(self._path("consumers", topic)))
        except NoNodeError:
            return []

    def consumer_topics(self) -> list[str]:
        try:
            return sorted(self._zk.get_children(self._path("consumers")))
        except NoNodeError:
            return []

    def watch_consumers(self, topic: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        path = self._path("consumers", topic)
        self._zk.ensure_path(path)
        return self._children_watch(path, lambda children: callback(sort_by_sequence(children)))

    # -- broadcasts and leadership (zk_broadcasts, zk_leader) -------------------------------
    def broadcast(self, topic: str, payload: bytes) -> int:
        return self._broadcasts.send(topic, payload)

    def broadcast_sequences(self, topic: str) -> list[int]:
        return self._broadcasts.sequences(topic)

    def read_broadcast(self, topic: str, seq: int) -> Optional[bytes]:
        return self._broadcasts.read(topic, seq)

    def watch_broadcasts(self, topic: str, callback: Callable[[list[int]], None]) -> Callable[[], None]:
        return self._broadcasts.watch(topic, callback)

    def prune_broadcasts(self, older_than: float) -> int:
        return self._broadcasts.prune(older_than)

    # -- signals: <root>/signals/<topic> and <root>/cancels/<topic>, one node per topic ------
    # Each signal sets its node's data (the sender's name): every DataWatch of it fires.
    def signal(self, topic: str, sender: str = "") -> None:
        self._set_signal(self._path("signals", topic), sender, f"signal {topic}")

    def signal_cancel(self, topic: str) -> None:
        self._set_signal(self._path("cancels", topic), "", f"signal a cancel of {topic}")

    def _set_signal(self, path: str, sender: str, what: str) -> None:
        try:
            try:
                self._zk.set(path, sender.encode())  # a new version: every DataWatch of it fires
            except NoNodeError:
                self._zk.ensure_path(path)
        except KazooException as exc:
            raise CoordinationError(f"cannot {what}: {exc!r}") from None

    def watch_cancels(self, topic: str, callback: Callable[[], None]) -> Callable[[], None]:
        return self._watch_node(self._path("cancels", topic), lambda sender: callback())

    def watch_signal(self, topic: str, callback: Callable[[Optional[str]], None]) -> Callable[[], None]:
        return self._watch_node(self._path("signals", topic), callback)

    def _watch_node(self, path: str, callback: Callable[[Optional[str]], None]) -> Callable[[], None]:
        self._zk.ensure_path(path)
        stopped = threading.Event()
        seen = [-1]  # the node's version at the previous call

        def on_data(data: Optional[bytes], stat: Optional[ZnodeStat]) -> bool:
            if stopped.is_set():
                return False  # returning False ends a kazoo DataWatch
            # Each signal moves the version by one; a watch re-reads the node when it fires, so
            # a jump of more than one means signals were heard as one: their senders unknown.
            version = stat.version if stat is not None else -1
            one = seen[0] >= 0 and version == seen[0] + 1
            seen[0] = version
            callback(data.decode(errors="replace") if one and data is not None else None)
            return True

        DataWatch(self._zk, path, on_data)
        return stopped.set

    def run_for_leader(self, identifier: str, lead: Callable[[threading.Event], None]) -> Callable[[], None]:
        return self._leadership.run_for_leader(identifier, lead)

    def leader(self) -> Optional[str]:
        return self._leadership.leader()

    # -- helpers ---------------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def _delete(self, path: str) -> int:
        if not self._zk.connected:
            # Waiting for the connection could block a shutdown forever: queue the delete, sent
            # once reconnected (an ephemeral node goes with its session anyway).
            log.info("not connected: %s is deleted once reconnected", path)
            self._zk.delete_async(path)
            return 0
        try:
            self._zk.delete(path)
            return 1
        except (NoNodeError, NotEmptyError):
            return 0
        except KazooException:
            log.warning("could not delete %s", path, exc_info=True)
            return 0

    def _children_watch(self, path: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        stopped = threading.Event()

        def on_children(children: list[str], event: object = None) -> bool:
            if stopped.is_set():
                return False  # returning False ends a kazoo ChildrenWatch
            if getattr(event, "type", None) == EventType.DELETED:
                return True
            callback(children)
            return True

        ChildrenWatch(self._zk, path, on_children, send_event=True)
        return stopped.set
