"""A module of the user's named as a standard library one (``random.py``) where a farm runs: its processes started
with that directory first on sys.path, so their own imports took the user's module and none started (`up` said only
"the gateway did not come up", after a traceback per process). They start with ``-P`` now; a replica puts the
directory first once its own imports are done, and says which files there are namesakes."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from streamserve.client import AsyncClient
from streamserve.runtime.processes import role_command
from streamserve.runtime.settings import Settings
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for
from tests.integration.conftest import deploy


async def test_a_replica_where_a_random_py_lies_starts_and_says_so(
    processes: Processes, settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "random.py").write_text('raise ImportError("the user\'s random.py was imported")\n')
    (tmp_path / "handlers.py").write_text("def echo(body):\n    return {'echo': body}\n")
    await deploy(settings, name="here", import_path="handlers:echo")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            role_command("worker", "here"), cwd=tmp_path, env=processes.env(), stdout=out, stderr=subprocess.STDOUT
        )
    processes.started["worker"] = worker
    async with AsyncClient(settings=settings) as client:
        assert await asyncio.wait_for(client.call("here", {"x": 1}), 30) == {"echo": {"x": 1}}, log.read_text()
    said = f"{tmp_path} holds random.py, named as standard library module(s)"
    wait_for(lambda: said in log.read_text(), 10, lambda: f"no warning of the namesake:\n{log.read_text()}")
    assert "Traceback" not in log.read_text(), log.read_text()
