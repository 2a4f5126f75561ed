"""The netns harness keeps its promises: hosts that talk over their own network under their own hostnames, a Redis
reachable across hosts only with its password, and nothing left behind (namespaces, links, processes) however the
block ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.e2e.netns import Host, Network, namespaces, netns_unavailable, redis_cli_binary, start_redis
from tests.harness.farm import command_line
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

PASSWORD = "netns-secret-5c2e"
TCP_CLOSE = 7  # tcp_info.tcpi_state of a socket with no connection left (linux/tcp_states.h)
# Connects to itself over 127.0.0.1: works only where lo is up.
LOOPBACK_PROBE = (
    "import socket; s = socket.create_server(('127.0.0.1', 0)); "
    "socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')"
)


@pytest.fixture
def netns() -> None:
    """Skip, with the reason, where this machine cannot make network namespaces."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)


def root_links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def assert_gone(net: Network, hosts: list[Host]) -> None:
    """No namespace, link or process of ``net`` is left."""
    assert not set(net.namespaces) & set(namespaces())
    assert f" {net.uplink}@" not in root_links()
    assert all(proc.poll() is not None for host in hosts for proc in host.procs)
    assert [pid for host in hosts for pid in host.pids()] == []


def test_hosts_reach_each_other_under_their_own_names(tmp_path: Path, netns: None) -> None:
    with Network(["redis", "sched", "edge"]) as net:
        redis_host, sched, edge = net.hosts
        url = start_redis(redis_host, probe_from=sched, log=tmp_path / "redis.log", password=PASSWORD)
        assert url == f"redis://:{PASSWORD}@{redis_host.ip}:6379/0"

        cli = [redis_cli_binary(), "-h", redis_host.ip, "--no-auth-warning"]
        assert sched.run([*cli, "-a", PASSWORD, "ping"]).stdout.strip() == "PONG"
        assert "NOAUTH" in edge.run([*cli, "ping"]).stdout  # the password is required from another host

        names = {host.name: host.run(["hostname"]).stdout.strip() for host in net.hosts}
        assert names == {"redis": "redis", "sched": "sched", "edge": "edge"}
        assert socket.gethostname() not in names.values()
        assert edge.run([sys.executable, "-c", LOOPBACK_PROBE]).stdout.strip() == "loopback ok"

        # The test process reaches a host directly, through the network's one link in the root namespace...
        route = subprocess.run(["ip", "route", "get", edge.ip], capture_output=True, text=True, check=True)
        assert f"dev {net.uplink} " in route.stdout
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            assert client.ping() is True
        finally:
            client.close()
        # ...and a host reaches nothing outside its network (asked of the routing table: nothing is sent).
        outside = edge.run(["ip", "route", "get", "198.51.100.7"])
        assert outside.returncode != 0 and "unreachable" in outside.stderr
    assert_gone(net, net.hosts)


def test_kill_all_stops_every_process_of_one_host_only(tmp_path: Path, netns: None) -> None:
    with Network(["a", "b"]) as net:
        a, b = net.hosts
        a.popen(["sleep", "60"], log=tmp_path / "a.log")
        a.popen(["setsid", "-f", "sleep", "61"], log=tmp_path / "a-escaped.log")  # leaves our process group
        b_sleep = b.popen(["sleep", "62"], log=tmp_path / "b.log")
        assert os.getpgid(b_sleep.pid) == b_sleep.pid  # popen gives each process a group of its own
        wait_for(lambda: sorted(command_line(pid) for pid in a.pids()) == [["sleep", "60"], ["sleep", "61"]], 10)
        wait_for(lambda: b.pids() == [b_sleep.pid], 10)
        escaped = next(pid for pid in a.pids() if command_line(pid) == ["sleep", "61"])
        assert os.getsid(escaped) == escaped  # a session of its own: killing our groups alone would miss it

        a.kill_all()
        assert a.pids() == []
        assert all(proc.poll() is not None for proc in a.procs)
        assert b_sleep.poll() is None and b.pids() == [b_sleep.pid]
    assert_gone(net, net.hosts)


def test_failure_in_the_body_still_cleans_up(tmp_path: Path, netns: None) -> None:
    net = Network(["a"])
    with pytest.raises(RuntimeError, match="test body failed"), net:
        net["a"].popen(["sleep", "60"], log=tmp_path / "a.log")
        raise RuntimeError("test body failed")
    assert_gone(net, net.hosts)


def test_failure_while_building_still_cleans_up(monkeypatch: pytest.MonkeyPatch, netns: None) -> None:
    real_add_host = Network._add_host

    def add_host_then_fail(self: Network, name: str, number: int) -> None:
        if number == 2:
            raise RuntimeError("building failed")
        real_add_host(self, name, number)

    monkeypatch.setattr(Network, "_add_host", add_host_then_fail)
    net = Network(["a", "b"])
    with pytest.raises(RuntimeError, match="building failed"), net:
        pytest.fail("the body ran although building failed")
    assert net.namespaces == [net.switch, f"{net.prefix}-a"]
    assert_gone(net, net.hosts)


def test_root_connections_to_hosts_are_aborted_before_the_network_goes(tmp_path: Path, netns: None) -> None:
    """Else closing one later would send its FIN by the machine's default route, off the machine."""
    # Bound to the uplink, so that even if this test fails nothing it sends can take another route.
    sock = socket.socket()
    try:
        with Network(["a"]) as net:
            a = net["a"]
            start_redis(a, probe_from=a, log=tmp_path / "redis.log", password=PASSWORD)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, net.uplink.encode())
            sock.settimeout(5)
            sock.connect((a.ip, 6379))
            sock.sendall(f"AUTH {PASSWORD}\r\n".encode())
            assert sock.recv(100) == b"+OK\r\n"
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE
    finally:
        sock.close()


def test_names_are_unique_per_run() -> None:
    first, second = Network(["a"]), Network(["a"])
    assert first.prefix != second.prefix and str(os.getpid()) in first.prefix
    assert len(first.uplink) <= 15  # Linux's limit for a link name


def test_unavailable_namespaces_give_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        assert netns_unavailable() == "network namespaces need root"
        return
    refusing_ip = tmp_path / "ip"
    refusing_ip.write_text(
        "#!/bin/sh\necho 'mount --make-shared /run/netns failed: Operation not permitted' >&2\nexit 1\n"
    )
    refusing_ip.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    reason = netns_unavailable.__wrapped__()
    assert reason is not None and reason.startswith("cannot create a network namespace: ip netns add ")
    assert reason.endswith("Operation not permitted")
