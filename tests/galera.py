"""A MariaDB Galera cluster (galera-4 from Debian) on this machine, for the cluster tests."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Optional

from tests.servers import MariaDB, free_port, wait_until

__all__ = ["GaleraCluster", "GaleraNode"]

GALERA_PROVIDER = "/usr/lib/galera/libgalera_smm.so"

log = logging.getLogger(__name__)


class GaleraNode(MariaDB):
    """One member of a ``GaleraCluster``.

    It runs as the ``mysql`` user: the rsync state transfer that brings a new or restarted node
    up to date starts an rsync daemon, and a daemon started by root would write as ``nobody``.
    """

    user = "mysql"
    reported = False  # a failed test reports the cluster's membership lines instead (failure_context)

    def __init__(self, cluster: "GaleraCluster", index: int, install: bool) -> None:
        directory = os.path.join(cluster.dir, f"node{index}")
        os.makedirs(os.path.join(directory, "data"))
        for path in (directory, os.path.join(directory, "data")):
            shutil.chown(path, self.user, self.user)
        super().__init__(install=install, directory=directory)
        self.cluster = cluster
        self.index = index
        self.group_port = free_port()  # group communication
        self.ist_port = free_port()  # incremental state transfer (writesets a rejoining node missed)
        self.sst_port = free_port()  # full state transfer (rsync)
        self.bootstrap = False

    def arguments(self) -> list[str]:
        # Failure detection is tightened for the tests: a killed node is evicted after about
        # 2 s instead of 5-15 s, during which the other nodes hold their commits. The install of
        # the survivors' new view keeps more room (6 s; Galera wants it below the inactive
        # timeout): with 3 s, the survivors of a kill on a loaded CI machine once formed no
        # primary component (wait_primary).
        provider_options = ";".join([
            f"base_port={self.group_port}", f"ist.recv_addr=127.0.0.1:{self.ist_port}", "gcache.size=256M",
            "evs.keepalive_period=PT0.5S", "evs.suspect_timeout=PT2S", "evs.inactive_timeout=PT8S",
            "evs.install_timeout=PT6S", "pc.wait_prim_timeout=PT30S"])
        args = [arg for arg in super().arguments() if arg != "--innodb-buffer-pool-size=256M"]
        args += [
            "--innodb-buffer-pool-size=128M", "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
            "--wsrep-on=ON", f"--wsrep-provider={GALERA_PROVIDER}", "--wsrep-cluster-name=tidemq-test",
            f"--wsrep-cluster-address=gcomm://{self.cluster.group_addresses}",
            f"--wsrep-node-name=node{self.index}", f"--wsrep-node-address=127.0.0.1:{self.group_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{self.port}",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}", "--wsrep-sst-method=rsync",
            f"--wsrep-provider-options={provider_options}", "--wsrep-slave-threads=2"]
        if self.bootstrap:
            args.append("--wsrep-new-cluster")
        return args

    def _serving(self, conn) -> bool:
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
            row = cur.fetchone()
        return bool(row) and row[1] == "Synced"

    def start(self, timeout: float = 180, wait: bool = True) -> "GaleraNode":
        super().start(timeout, wait)
        return self


class GaleraCluster:
    """A MariaDB Galera cluster (galera-4) of ``size`` nodes on 127.0.0.1.

    The first node bootstraps the cluster; the others join it and receive its data by state
    transfer. ``kill(i)`` is a crash (SIGKILL); ``start_node(i)`` brings the node back into the
    running cluster, which sends it what it missed.
    """

    def __init__(self, size: int = 3) -> None:
        self.dir = tempfile.mkdtemp(prefix="tidemq-galera-")
        os.chmod(self.dir, 0o755)  # the nodes run as the mysql user
        self.nodes: list[GaleraNode] = []
        for index in range(size):
            self.nodes.append(GaleraNode(self, index, install=index == 0))

    @property
    def group_addresses(self) -> str:
        return ",".join(f"127.0.0.1:{node.group_port}" for node in self.nodes)

    def start(self, timeout: float = 180) -> "GaleraCluster":
        first = self.nodes[0]
        first.bootstrap = True
        first.start(timeout)
        first.bootstrap = False  # restarted later, it joins the running cluster
        for node in self.nodes[1:]:
            node.start(timeout, wait=False)
        for node in self.nodes[1:]:
            node.wait_ready(timeout)
        return self

    def addresses(self, order: Optional[list[int]] = None) -> str:
        """``host:port,host:port,...`` of the nodes, in ``order`` (default: all, in index order)."""
        return ",".join(f"127.0.0.1:{self.nodes[i].port}" for i in (order or range(len(self.nodes))))

    def url(self, database: str, order: Optional[list[int]] = None) -> str:
        """A tidemq database URL naming several nodes: the broker uses the first that serves."""
        return f"mysql+pymysql://root@{self.addresses(order)}/{database}"

    def serving(self) -> list[GaleraNode]:
        return [node for node in self.nodes if node.proc is not None and node.proc.poll() is None]

    def execute(self, sql: str, database: Optional[str] = None) -> list[tuple]:
        return self.serving()[0].execute(sql, database)

    def create_database(self, name: str, order: Optional[list[int]] = None) -> str:
        self.execute(f"DROP DATABASE IF EXISTS `{name}`")
        self.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return self.url(name, order)

    def size(self) -> int:
        """The cluster size as a serving node sees it."""
        return int(self.execute("SHOW STATUS LIKE 'wsrep_cluster_size'")[0][1])

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (a crash)."""
        self.nodes[index].kill()

    def primary(self) -> bool:
        """Whether every serving node is Synced in one primary component of all serving nodes."""
        nodes = self.serving()
        for node in nodes:
            status = dict(node.execute("SHOW STATUS WHERE Variable_name IN "
                                       "('wsrep_cluster_status', 'wsrep_cluster_size', 'wsrep_local_state_comment')"))
            if (status.get("wsrep_cluster_status") != "Primary" or status.get("wsrep_local_state_comment") != "Synced"
                    or int(status.get("wsrep_cluster_size", 0)) != len(nodes)):
                return False
        return True

    def wait_primary(self, timeout: float = 120, grace: float = 20) -> bool:
        """Wait until the serving nodes form one primary component again, after a kill.

        On a loaded machine the survivors of a crash can time out installing their new view and
        stay non-primary (wsrep state "Initialized") until the dead node returns: a CI run saw
        both survivors refuse every write for the two minutes its test waited. Galera's answer
        is the operator's: bootstrap the survivors (``pc.bootstrap=YES``). After ``grace``
        seconds with no primary component this does so on the first serving node, logs it, and
        returns True; it returns False when the cluster re-formed by itself.
        """
        try:
            wait_until(self.primary, grace, 0.1)
            return False
        except TimeoutError:
            pass
        if any(node.execute("SHOW STATUS LIKE 'wsrep_cluster_status'")[0][1] == "Primary" for node in self.serving()):
            wait_until(self.primary, timeout, 0.1, "the serving Galera nodes synced in one primary component")
            return False
        survivor = self.serving()[0]
        log.warning("Galera: the serving nodes formed no primary component within %s s; bootstrapping node%d.%s",
                    grace, survivor.index, self.membership_log())
        survivor.execute("SET GLOBAL wsrep_provider_options='pc.bootstrap=YES'")
        wait_until(self.primary, timeout, 0.1, "a primary component of the serving Galera nodes")
        return True

    def membership_log(self, lines: int = 15, nodes: Optional[list[GaleraNode]] = None) -> str:
        """The last membership lines (suspicions, timeouts, views) of the error log of each of
        ``nodes`` (the serving ones by default): the fixture deletes the logs with the cluster, so
        a test that needed a bootstrap, or failed, keeps them in its own output."""
        words = ("suspect", "timer expired", "timed out", "view(", "NON_PRIM", "declaring inactive", "quorum")
        parts = []
        for node in self.serving() if nodes is None else nodes:
            try:
                with open(os.path.join(node.dir, "error.log"), errors="replace") as f:
                    found = [line.rstrip() for line in f
                             if any(word in line for word in words) and "Passing config" not in line]
            except OSError as exc:
                found = [f"(unreadable: {exc})"]
            parts.append(f"\nnode{node.index}:\n" + "\n".join(found[-lines:]))
        return "".join(parts)

    def start_node(self, index: int, timeout: float = 180) -> None:
        """Start node ``index`` again and wait until it has caught up (Synced)."""
        self.nodes[index].start(timeout)

    def cleanup(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
