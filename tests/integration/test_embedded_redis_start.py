"""The embedded redis-server, started by `up`: one that dies as it starts is an error `up` can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamserve.runtime import embedded_redis
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.wire.errors import RedisUnavailableError


def test_a_redis_server_that_exits_before_it_reads_its_password_is_an_exit_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The password goes through its standard input: one that dies first (killed as `up` restarts it) left no reader,
    and the BrokenPipeError ended `up` (exit 141) instead of the next look restarting it."""
    dies_at_once = tmp_path / "redis-server"
    dies_at_once.write_text("#!/bin/sh\nexit 1\n")
    dies_at_once.chmod(0o755)
    monkeypatch.setattr(embedded_redis, "redis_server_binary", lambda: str(dies_at_once))
    # Longer than a pipe holds: the write waits for a reader, and finds none once the process has exited.
    server = EmbeddedRedis(port=free_port(), password="p" * 200_000, tie_to_parent=False)
    with pytest.raises(RedisUnavailableError, match="exited at start"):
        server.start(timeout_s=10)
    assert not server.running
