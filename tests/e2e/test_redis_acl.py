"""A whole farm runs as a Redis ACL user confined to its keys and channels: the docs' line, word for word.

The line is the one docs/operations.md prints in its Security section.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from streamserve.runtime.embedded_redis import redis_server_binary
from streamserve.runtime.processes import free_port, stop_group, wait_until
from tests.harness.farm import Farm
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

PASSWORD = "farm-secret-8d1f"
ADMIN_PASSWORD = "admin-secret-33a0"


def docs_acl_line() -> str:
    """The ACL line as docs/operations.md's Security section prints it, with this test's password in place."""
    page = (ROOT / "docs" / "operations.md").read_text()
    block = re.search(r"<!-- acl-begin -->\n```\n(.+?)\n```\n<!-- acl-end -->", page, re.S)
    assert block is not None, "docs/operations.md lost its ACL block"
    line = block.group(1).strip()
    assert line.startswith("user streamserve on >CHANGE-ME ")
    return line.replace(">CHANGE-ME", f">{PASSWORD}")


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[int]:
    """A redis-server whose default user is off; the farm's user is the docs', plus an admin for the test."""
    port = free_port()
    conf = tmp_path / "redis.conf"
    conf.write_text(
        f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {tmp_path}\n'
        "user default off\n"
        f"user admin on >{ADMIN_PASSWORD} ~* &* +@all\n"
        f"{docs_acl_line()}\n"
    )
    proc = subprocess.Popen(
        [redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    admin = redis.Redis(port=port, username="admin", password=ADMIN_PASSWORD)
    try:

        def up() -> bool:
            try:
                return bool(admin.ping())
            except redis.RedisError:
                return proc.poll() is not None

        assert wait_until(up, 10) and proc.poll() is None, "redis-server did not start with the docs' ACL line"
        yield port
    finally:
        admin.close()
        stop_group(proc, timeout_s=5)


def test_the_farm_runs_as_the_documented_acl_user(acl_redis: int, tmp_path: Path) -> None:
    config = tmp_path / "farm.yaml"
    config.write_text(
        "deployments:\n"
        "  - name: echo\n    import_path: examples.echo:Echo\n    num_replicas: 1\n"
        "  - name: add\n    import_path: examples.functions:add\n    num_replicas: 1\n"
        "  - name: forecast\n    import_path: examples.forecasters:Forecasters\n    num_replicas: 1\n"
    )
    url = f"redis://streamserve:{PASSWORD}@127.0.0.1:{acl_redis}/0"
    admin = redis.Redis(port=acl_redis, username="admin", password=ADMIN_PASSWORD)
    farm = Farm(config, tmp_path / "up.log", redis_url=url).start()
    try:
        assert farm.post("/echo", {"x": 1}).json() == {"echo": {"x": 1}, "greeting": "hello"}
        for _ in range(2):  # the model is given to the replica, then routed to it (the scripts of multiplexing)
            assert farm.post("/forecast", {"days": 1}, headers={"X-Model-Id": "store-1"}).status_code == 200
        accepted = farm.post("/add", {"a": 1, "b": 2}, headers={"Prefer": "respond-async"})
        assert accepted.status_code == 202, accepted.text
        job: dict[str, object] = {}

        def finished() -> bool:
            job.update(httpx.get(farm.base_url + accepted.headers["location"], timeout=10).json())
            return job["status"] in ("finished", "failed")

        wait_for(finished, 30, f"job never finished: {job}")
        assert job["result"] == {"sum": 3}
        farm.cli("scale", "echo", "2", "--wait", "--timeout", "60")
        assert farm.status()["echo"]["running"] == 2
        # Nothing the farm tried was refused (a refusal would show in the ACL log, even where it was handled).
        assert admin.acl_log() == [], str(admin.acl_log()[0])
        # The default user is off: without the farm's credentials nothing gets in.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=acl_redis).ping()
        assert "farm-secret" not in farm.log().decode(), "up printed the Redis password"
        # ps shows every user the command lines: `up --redis-url` moves a URL with a password to its environment
        # (starting again), and its children get it through theirs.
        shown = {pid: " ".join(argv) for pid, argv in farm.processes().items()}
        assert len(shown) >= 5 and any(" up " in line for line in shown.values()), shown
        assert not [line for line in shown.values() if PASSWORD in line], shown
    finally:
        code = farm.stop()
        admin.close()
    assert code == 0


def docs_rules_without(dropped: str) -> list[str]:
    """The docs' ACL rules (what follows ``user streamserve``), less ``dropped``."""
    rules = docs_acl_line().split()[2:]
    assert dropped in rules, rules
    return [rule for rule in rules if rule != dropped]


@pytest.mark.parametrize(
    ("dropped", "named"),
    [
        ("+@scripting", "+@scripting (Redis: this user has no permissions to run the 'eval' command"),
        ("&{streamserve}:*", "the channels {streamserve}:*"),
        ("~{streamserve}:*", "the keys {streamserve}:*"),
        ("~streamserve:*", "the keys streamserve:*"),
        ("+@transaction", "+@transaction"),
        ("~rq:*", "the keys rq:*"),  # (asynchronous jobs: on by default)
        ("+info", "+info"),
    ],
)
def test_a_role_whose_redis_user_lacks_a_rule_stops_at_start_naming_it(
    acl_redis: int, dropped: str, named: str
) -> None:
    """Not on its first use of it: the scheduler died three times on its first script, with a traceback."""
    with redis.Redis(port=acl_redis, username="admin", password=ADMIN_PASSWORD) as admin:
        admin.execute_command("ACL", "SETUSER", "partial", "reset", *docs_rules_without(dropped))
    url = f"redis://partial:{PASSWORD}@127.0.0.1:{acl_redis}/0"
    done = subprocess.run([STREAMSERVE, "scheduler", "--redis-url", url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "lacks permissions the farm needs" in done.stderr and named in done.stderr, done.stderr
    assert "docs/operations.md (Security)" in done.stderr and "Traceback" not in done.stderr


def test_up_on_a_redis_user_that_lacks_a_rule_stops_before_it_starts_anything(acl_redis: int, tmp_path: Path) -> None:
    with redis.Redis(port=acl_redis, username="admin", password=ADMIN_PASSWORD) as admin:
        admin.execute_command("ACL", "SETUSER", "partial", "reset", *docs_rules_without("+@scripting"))
    url = f"redis://partial:{PASSWORD}@127.0.0.1:{acl_redis}/0"
    command = [STREAMSERVE, "up", str(ROOT / "examples" / "streamserve.yaml"), "--port", str(free_port())]
    proc = subprocess.Popen(
        [*command, "--redis-url", url, "--data-dir", str(tmp_path / "farm")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        stop_group(proc, timeout_s=5)
    assert proc.returncode == 2, err
    assert "lacks permissions the farm needs" in err and "+@scripting" in err, err
    assert "starting" not in err and "Traceback" not in err, err
