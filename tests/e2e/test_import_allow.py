"""A farm under ``STREAMSERVE_IMPORT_ALLOW=examples`` never runs ``examples.echo:os.system`` (issue 27, defect 2);
and with tenant API keys, `up` says that requests need one.

The module is under the prefix, so the deploy is written; every replica refuses it at import, the goal fails
with the reason, and a call is turned away with it, without the command running.
"""

from __future__ import annotations

import subprocess
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


KEY = "k" * 32
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def strict_farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """A farm with both locks a shared host would set: the import allow list, and tenant API keys."""
    config = "deployments:\n  - name: echo\n    import_path: examples.echo:Echo\n"
    tmp_path = tmp_path_factory.mktemp("strict")
    keys = tmp_path / "tenant-keys"
    keys.write_text(f"{KEY} acme\n")
    env = {**FAST_HEARTBEATS, "STREAMSERVE_IMPORT_ALLOW": "examples", "STREAMSERVE_TENANT_KEYS": str(keys)}
    farm = farm_on(config, tmp_path, extra_env=env)
    try:
        yield farm.start()
    finally:
        farm.stop()


def test_the_banner_says_requests_need_a_tenant_key(strict_farm: Farm) -> None:
    banner = strict_farm.log().decode()
    assert "tenants   every request to a deployment needs 'Authorization: Bearer KEY'" in banner, banner
    assert (
        f"a key of {strict_farm.config.parent / 'tenant-keys'} (STREAMSERVE_TENANT_KEYS); without one it is 401"
        in banner
    )
    assert strict_farm.post("/echo", "hi").status_code == 401


def test_a_path_through_an_imported_module_never_runs(strict_farm: Farm, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned.txt"
    pwn = parse_config({"deployments": [{"name": "pwn", "import_path": "examples.echo:os.system"}]})
    with Client(strict_farm.effective_redis_url) as client:
        goals = client.deploy(pwn)
        with pytest.raises(GoalFailedError) as failed:
            client.wait_for_goal(goals["pwn"], timeout=60)
    assert REFUSAL in str(failed.value)

    call = strict_farm.post("/pwn", f"touch {pwned}", headers=AUTHORIZED)
    assert call.status_code == 503, call.text
    assert REFUSAL in call.json()["message"]
    assert REFUSAL in strict_farm.status()["pwn"]["message"]
    assert not pwned.exists()
    # What the allowed module defines still serves.
    assert strict_farm.post("/echo", "hi", headers=AUTHORIZED).json()["echo"] == "hi"


def test_a_deploy_from_beside_the_farm_is_checked_against_its_allow_list(strict_farm: Farm, tmp_path: Path) -> None:
    """`streamserve deploy --data-dir` (the farm found from its data directory) without STREAMSERVE_IMPORT_ALLOW in
    its own environment: the farm's list applies (it was written, and only the replicas refused it)."""
    config = tmp_path / "elsewhere.yaml"
    config.write_text("deployments:\n  - name: dumps\n    import_path: json:dumps\n")
    env = {k: v for k, v in strict_farm.env().items() if k not in ("STREAMSERVE_IMPORT_ALLOW", "REDIS_URL")}
    env.pop("STREAMSERVE_REDIS_URL", None)
    deploy = subprocess.run(
        [strict_farm.command, "deploy", str(config), "--data-dir", str(strict_farm.data_dir)],
        cwd=strict_farm.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert deploy.returncode == 2, deploy.stdout + deploy.stderr
    assert "outside STREAMSERVE_IMPORT_ALLOW (examples)" in deploy.stderr
    assert "dumps" not in strict_farm.status()
