"""Small helpers for child processes that must not outlive their parent (used by `up` and tests)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from streamserve.wire.ids import ReplicaID

_PR_SET_PDEATHSIG = 1


# How every farm process starts, after this interpreter and before its role: ``-P`` keeps the directory it runs in off
# the front of sys.path (a random.py or email.py where the farm ran shadowed the standard library's, and no process
# started; a replica puts the directory on sys.path itself, once its own imports are done).
ROLE_LAUNCH = ("-P", "-m", "streamserve")
# How a farm's processes started before -P (still recognised: a farm left running across an upgrade is ended too).
_EARLIER_LAUNCH = ("-m", "streamserve")


def role_command(role: str, *args: str) -> list[str]:
    """How every farm process starts: ``python -P -m streamserve ROLE ARGS`` with this interpreter."""
    return [sys.executable, *ROLE_LAUNCH, role, *args]


def role_in(argv: Sequence[str]) -> str | None:
    """The role a command line that role_command made runs ("worker", "gateway"...), else None."""
    for launch in (ROLE_LAUNCH, _EARLIER_LAUNCH):
        if tuple(argv[1 : 1 + len(launch)]) == launch and len(argv) > len(launch) + 1:
            return argv[len(launch) + 1]
    return None


def die_with_parent() -> None:
    """preexec_fn: on Linux, have the kernel send SIGTERM to the child when its parent dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def end_with_spawning_process() -> None:
    """In a process multiprocessing spawned (one of a gateway's --workers): SIGTERM once the process that spawned it
    dies, killed -9 too (its workers kept serving its port for ever, and a new gateway could not bind it); at once
    when it died before the kernel was asked."""
    die_with_parent()
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[], None]) -> Iterator[None]:
    """Run ``callback`` on SIGTERM or SIGINT while inside (on the running asyncio loop); restore afterwards."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def bind_problem(host: str, port: int) -> str:
    """ "" when ``host:port`` can be listened on now; else why not: "in use", or what the system says of the address
    (a name that resolves to nothing, an address of no interface of this machine)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        return f"{host!r} is no address of this machine ({exc.strerror})"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
    return ""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (someone may take it before we bind it: callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the child's process group, wait up to ``timeout_s``, then SIGKILL the group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# How many times end_own_group looks again for what is left of its group: a process that forked as it was killed may
# have left a child that the look before did not see.
GROUP_SWEEPS = 10


def end_own_group() -> int:
    """SIGKILL the other processes of the process group this process leads (what its code started: a model server, a
    pool), as the scheduler does once a replica it started has ended (scheduler/launcher.py), for a process that
    nobody will do it for. Nothing when it does not lead its group: that group is somebody else's. Returns how many
    it killed."""
    me = os.getpid()
    if os.getpgrp() != me:
        return 0
    killed: set[int] = set()
    for _ in range(GROUP_SWEEPS):
        found = set(group_members(me)) - killed - {me}
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= found
    return len(killed)


def end_with_own_group() -> None:
    """SIGKILL the process group this process leads, itself included, at once: no thread of it can start another
    process after the others are killed (end_own_group's sweeps leave that window). Nothing when it does not lead
    its group."""
    me = os.getpid()
    if os.getpgrp() == me:
        os.killpg(me, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """The pids of the processes of process group ``pgid`` (not its zombies: they are gone but for a wait)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            # After the command name (in parentheses, and free to contain spaces): the state, the ppid, the group.
            state, _ppid, group, *_ = stat.read_text().rpartition(")")[2].split()
            if int(group) == pgid and state not in ("Z", "X"):
                members.append(int(stat.parent.name))
    return members


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passes; return whether it held."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def process_ref(pid: int) -> str | None:
    """``"PID:START"`` (START: when it started, in clock ticks since boot), naming one process for as long as it
    lives, unlike a pid alone, which the kernel reuses; None if there is no such process, or only its zombie (dead,
    not yet reaped by its parent)."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return f"{pid}:{fields[19]}"


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (in parentheses, and free to contain spaces): the first
    is the state, the 20th the start time; [] when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rpartition(")")[2].split()


def is_running(ref: str) -> bool:
    """Whether the process ``process_ref`` named is still the one running."""
    pid, _, _start = ref.partition(":")
    return pid.isdigit() and process_ref(int(pid)) == ref


def pids_with_env(name: str, value: str) -> list[int]:
    """Every process (other than this one) whose environment has ``name=value``."""
    wanted = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
    return found


def pids_working_in(directory: Path, program: str) -> list[int]:
    """Every process (other than this one) of ``program`` (a name in its command line) whose working directory is
    ``directory``."""
    where = directory.resolve()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if program.encode() in (proc / "cmdline").read_bytes() and (proc / "cwd").resolve() == where:
                found.append(int(proc.name))
    return found


def process_state(pid: int) -> str:
    """The process's state letter in /proc/PID/stat (R running, S sleeping, T stopped, Z a zombie...), "" once it is
    gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def farm_role(pid: int) -> str | None:
    """The role ``pid`` runs ("worker", "gateway"...) when it is one of a farm's own processes (role_command's
    ``python -m streamserve ROLE``), else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return role_in(argv)


def runs_a_role(pid: int) -> bool:
    """Whether ``pid`` runs one of a farm's own processes."""
    return farm_role(pid) is not None


def runs_replica(pid: int, replica_id: ReplicaID) -> bool:
    """Whether ``pid`` is a live replica process with this id (its command line says so; guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"\0--replica-id\0" + replica_id.to_str().encode() + b"\0" in cmdline


# Command-line options whose value may be a URL with a password, and the setting each one is.
SECRET_URL_OPTIONS = {"--redis-url": "STREAMSERVE_REDIS_URL"}


def without_secret_urls(argv: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """``argv`` with every URL option that holds a password (``user:pw@``, or unix://'s ``?password=``) taken
    out, and the environment that says the same (STREAMSERVE_REDIS_URL wins over REDIS_URL, as --redis-url does);
    None when there is no such option (or the command is ``manifests``, which is told no password at once)."""
    if argv[:1] == ["manifests"]:
        return None  # its --redis-url is the cluster's Redis, taken from no environment: it refuses one with a password
    kept: list[str] = []
    env: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        option, equals, value = arg.partition("=")
        if option in SECRET_URL_OPTIONS and not equals:
            value = next(args, "")
        if option in SECRET_URL_OPTIONS and ("@" in value.partition("://")[2] or "password=" in value):
            env[SECRET_URL_OPTIONS[option]] = value
        else:
            kept.append(arg)
            if option in SECRET_URL_OPTIONS and not equals and value:
                kept.append(value)
    return (kept, env) if env else None


def hide_passwords_from_ps(argv: list[str]) -> None:
    """Start again with URLs that hold a password (``--redis-url redis://:pw@host``) moved from the command line,
    which ``ps`` shows every user of the machine, to the environment, which only this user can read."""
    moved = without_secret_urls(argv)
    if moved is not None:
        kept, env = moved
        os.environ.update(env)
        os.execv(sys.executable, [sys.executable, *ROLE_LAUNCH, *kept])
