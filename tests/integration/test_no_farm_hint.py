"""A command run where no `up` runs, given no Redis, tries the default one; when that fails, it says why it tried it:
every farm command alike, those whose client or probe reports the failure (`call`, `health`) too."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from streamserve.runtime.processes import port_is_free
from tests.harness.paths import STREAMSERVE

HINT = (
    "(no `streamserve up` runs from .streamserve/, so the default Redis was tried: run the command where `up` runs, "
    "or pass --data-dir, --redis-url or REDIS_URL)"
)


@pytest.mark.parametrize("command", [("status",), ("health",), ("call", "echo", "1")])
def test_a_command_with_no_farm_says_why_it_tried_the_default_redis(tmp_path: Path, command: tuple[str, ...]) -> None:
    if not port_is_free("127.0.0.1", 6379):
        pytest.skip("a Redis listens on the default port here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
    result = subprocess.run(
        [STREAMSERVE, *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.rstrip().endswith(HINT), result.stderr
    assert "the default Redis was tried" not in result.stderr.rstrip().removesuffix(HINT)  # once (`call`: twice)
