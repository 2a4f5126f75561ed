"""A farm under ``STREAMSERVE_IMPORT_ALLOW=examples`` never runs ``examples.echo:os.system`` (issue 27, defect 2).

The module is under the prefix, so the deploy is written; every replica refuses it at import, the goal fails
with the reason, and a call is turned away with it, without the command running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamserve import Client, GoalFailedError
from streamserve.wire.config import parse_config
from tests.harness.farm import FAST_HEARTBEATS, Farm, farm_on

pytestmark = pytest.mark.e2e

REFUSAL = (
    "import_path 'examples.echo:os.system' is refused: 'examples.echo:os' is the module 'os' from module 'os', "
    "outside STREAMSERVE_IMPORT_ALLOW (examples)"
)


@pytest.fixture
def strict_farm(tmp_path: Path) -> Iterator[Farm]:
    config = "deployments:\n  - name: echo\n    import_path: examples.echo:Echo\n"
    farm = farm_on(config, tmp_path, extra_env={**FAST_HEARTBEATS, "STREAMSERVE_IMPORT_ALLOW": "examples"})
    try:
        yield farm.start()
    finally:
        farm.stop()


def test_a_path_through_an_imported_module_never_runs(strict_farm: Farm, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned.txt"
    pwn = parse_config({"deployments": [{"name": "pwn", "import_path": "examples.echo:os.system"}]})
    with Client(strict_farm.effective_redis_url) as client:
        goals = client.deploy(pwn)
        with pytest.raises(GoalFailedError) as failed:
            client.wait_for_goal(goals["pwn"], timeout=60)
    assert REFUSAL in str(failed.value)

    call = strict_farm.post("/pwn", f"touch {pwned}")
    assert call.status_code == 503, call.text
    assert REFUSAL in call.json()["message"]
    assert REFUSAL in strict_farm.status()["pwn"]["message"]
    assert not pwned.exists()
    assert strict_farm.post("/echo", "hi").json()["echo"] == "hi"  # what the allowed module defines still serves
