"""STREAMSERVE_KEY_PREFIX on a whole farm: `up`, its scheduler, gateway, replicas and job workers all use it.

Every process reads the prefix from its environment, so this is checked on real processes too
(tests/integration/test_key_prefix.py checks the in-process pieces). RQ's own keys start with ``rq:``
and name the queue ``<prefix>:jobs``, as docs/tutorial.md says ("Asynchronous jobs").
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from streamserve import Client
from streamserve.runtime.settings import Settings
from tests.harness.farm import FAST_HEARTBEATS, Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

PREFIX = "acme-farm"
CONFIG = """\
deployments:
  - {name: noop, import_path: 'examples.functions:noop', graceful_shutdown_timeout_s: 1}
endpoints:
  - {name: split, traffic: {noop: 1}}
"""


def test_a_farm_with_a_custom_prefix_serves_and_writes_only_keys_under_it(tmp_path: Path) -> None:
    config = tmp_path / "prefixed.yaml"
    config.write_text(CONFIG)
    # Every process gets STREAMSERVE_KEY_PREFIX from its environment, as a user would set it.
    farm = Farm(config, tmp_path / "up.log", extra_env={**FAST_HEARTBEATS, "STREAMSERVE_KEY_PREFIX": PREFIX})
    farm.start()
    try:
        assert farm.post("/noop", [1]).json() == [1]
        assert farm.post("/split", [2]).json() == [2]
        with Client(settings=Settings(redis_url=farm.effective_redis_url, key_prefix=PREFIX)) as client:
            assert client.call("noop", [3], timeout=10) == [3]
        accepted = farm.post("/noop", [4], headers={"Prefer": "respond-async"})
        assert accepted.status_code == 202
        job_url = farm.base_url + accepted.headers["location"]
        wait_for(lambda: httpx.get(job_url, timeout=5).json()["status"] == "finished", 30, "the job did not finish")
        assert httpx.get(job_url, timeout=5).json()["result"] == [4]
        assert farm.status()["noop"]["running"] == 1  # `streamserve status` with the same environment

        with redis.Redis.from_url(farm.effective_redis_url) as r:
            keys = sorted(k.decode() for k in r.scan_iter(count=1000))
            channels = sorted(c.decode() for c in r.pubsub_channels())
        assert [k for k in keys if not k.startswith((f"{PREFIX}:", f"{{{PREFIX}}}:", "rq:"))] == []
        assert [k for k in keys if k.startswith(("streamserve:", "{streamserve}"))] == []
        expected = {
            f"{{{PREFIX}}}:deployments",
            f"{{{PREFIX}}}:endpoints",
            f"{{{PREFIX}}}:scheduler:leader",
            f"{{{PREFIX}}}:deployment_status",
            f"{PREFIX}:{{noop}}:requests",
            f"{PREFIX}:{{noop}}:replicas",
            f"{PREFIX}:{{noop}}:heartbeats",
            f"rq:workers:{PREFIX}:jobs",
            f"rq:finished:{PREFIX}:jobs",
        }
        assert expected <= set(keys), sorted(expected - set(keys))
        assert f"{{{PREFIX}}}:config" in channels  # besides RQ's own rq:pubsub:<worker> channels
        assert [c for c in channels if not c.startswith((f"{{{PREFIX}}}:", "rq:"))] == []
    finally:
        farm.stop()
