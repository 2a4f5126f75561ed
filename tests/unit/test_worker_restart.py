"""A worker that starts again on new code runs its own command line as a new replica taking over the old one."""

from __future__ import annotations

import sys

from streamserve.wire.ids import ReplicaID
from streamserve.workers.main import restart_command


def test_the_new_process_keeps_the_options_and_takes_over_the_old_id() -> None:
    old = ReplicaID("echo", "1234abcd")
    argv = ["echo", "--redis-url", "redis://h:6379/0", "--replica-id", "echo#1234abcd", "--takes-over", "echo#00"]
    assert restart_command(argv, old) == [
        sys.executable, "-P", "-m", "streamserve", "worker", "echo", "--redis-url", "redis://h:6379/0",
        "--takes-over", "echo#1234abcd",
    ]  # fmt: skip
    assert restart_command(["echo", "--replica-id=echo#1234abcd"], old)[-3:] == ["echo", "--takes-over", old.to_str()]
