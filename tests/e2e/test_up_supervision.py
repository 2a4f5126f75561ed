"""`streamserve up` restarts a gateway that exits, and stops the farm when it keeps exiting (over 5 times a minute)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from streamserve.runtime.processes import port_is_free
from tests.harness.farm import Farm, pids_with_marker
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - {name: noop, import_path: 'examples.functions:noop', graceful_shutdown_timeout_s: 1}
"""


def gateway_pids(farm: Farm) -> list[int]:
    return farm.role_pids().get("gateway", [])


def serves(farm: Farm) -> bool:
    try:
        return bool(farm.post("/noop", [1]).json() == [1])
    except httpx.HTTPError:
        return False


def test_up_restarts_a_killed_gateway_and_gives_up_when_it_keeps_exiting(tmp_path: Path) -> None:
    config = tmp_path / "noop.yaml"
    config.write_text(CONFIG)
    farm = Farm(config, tmp_path / "up.log")
    farm.start()
    try:
        assert farm.proc is not None
        assert serves(farm)
        killed = gateway_pids(farm)
        assert len(killed) == 1

        def new_gateway() -> int:
            """The gateway up started in place of the ones killed so far."""

            def started() -> list[int]:
                return [pid for pid in gateway_pids(farm) if pid not in killed]

            wait_for(lambda: bool(started()) or farm.proc.poll() is not None, 20, "no new gateway")  # type: ignore[union-attr]
            assert farm.proc is not None and farm.proc.poll() is None, "up exited instead of restarting the gateway"
            return started()[0]

        # One exit: the gateway comes back and HTTP with it.
        os.kill(killed[0], signal.SIGKILL)
        killed.append(new_gateway())
        wait_for(lambda: serves(farm), 30, "HTTP did not come back after the gateway was restarted")
        assert b"the gateway exited with code -9; restarting it" in farm.log()

        # Four more within the minute: each is restarted too, five restarts in all, and up is still running.
        for _ in range(4):
            os.kill(killed[-1], signal.SIGKILL)
            killed.append(new_gateway())
        assert farm.log().count(b"the gateway exited with code -9; restarting it") == 5

        # The sixth exit within the minute: up gives up, says why, and stops everything.
        os.kill(killed[-1], signal.SIGKILL)
        try:
            code = farm.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"up did not give up:\n{farm.log().decode(errors='replace')[-3000:]}") from None
        assert code == 1
        log = farm.log().decode(errors="replace")
        assert "error: the gateway keeps exiting (code -9); stopping" in log, log[-3000:]
        assert pids_with_marker(farm.token) == []
        assert port_is_free("127.0.0.1", farm.port)
        assert farm.redis_port is not None and port_is_free("127.0.0.1", farm.redis_port)
    finally:
        farm.stop()


SLOW_START = """\
deployments:
  - {name: noop, import_path: 'examples.functions:noop', graceful_shutdown_timeout_s: 1}
  - {name: slow, import_path: 'tests.deployments:SlowStart', init_kwargs: {seconds: 3}, graceful_shutdown_timeout_s: 1}
"""


def test_up_restarts_an_embedded_redis_that_dies_before_the_banner(tmp_path: Path) -> None:
    """Supervised from the moment it starts: killed while the replicas start, it comes back and `up` comes up."""
    config = tmp_path / "slow.yaml"
    config.write_text(SLOW_START)
    farm = Farm(config, tmp_path / "up.log")
    proc = farm.launch()
    try:
        # The gateway serves (`up` waits for the replicas now); the slow replica is still in its constructor.
        starting = b"streamserve: starting the replicas of"
        wait_for(lambda: starting in farm.log(), 30, lambda: farm.fail("no start").args[0])
        wait_for(lambda: len(farm.role_pids().get("worker", [])) == 2, 30, lambda: farm.fail("no replicas").args[0])
        [redis_pid] = farm.role_pids()["redis-server"]
        assert b"streamserve is up" not in farm.log()
        os.kill(redis_pid, signal.SIGKILL)
        wait_for(lambda: b"streamserve is up" in farm.log() or proc.poll() is not None, 60, "neither up nor exited")
        assert proc.poll() is None, farm.fail(f"`up` exited with {proc.returncode}")
        log = farm.log().decode()
        assert "the embedded redis-server died; restarting it on its data" in log, log[-3000:]
        assert "NOT RUNNING" not in log, log[-3000:]
        wait_for(lambda: serves(farm), 30, "the farm does not serve after its Redis came back")
        assert farm.stop() == 0
    finally:
        farm.stop()


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def next_redis_server(up_pid: int, old: int) -> int:
    """The redis-server `up` starts in place of ``old``, as soon as it exists (polled without pause, 10 s at most)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in children_of(up_pid):
            if pid != old and Path(f"/proc/{pid}/comm").read_text(errors="replace").startswith("redis-server"):
                return pid
    raise AssertionError("up started no new redis-server")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_each_child_of_up_is_replaced_on_a_restart_budget_of_its_own(tmp_path: Path) -> None:
    """With --gateway-workers 2, a gateway killed -9 is replaced and its workers ended (they held its port: every new
    gateway failed to bind, and up stopped the farm); three gateway and three scheduler deaths are no child that
    keeps dying (they shared one budget of five); a redis-server killed again while up restarts it is restarted
    again (up stopped the farm)."""
    config = tmp_path / "noop.yaml"
    config.write_text(CONFIG)
    farm = Farm(config, tmp_path / "up.log")
    farm.extra_args = ["--gateway-workers", "2"]
    farm.start()
    try:
        assert farm.proc is not None and serves(farm)

        def replaced(role: str, old: int) -> int:
            def new() -> list[int]:
                return [pid for pid in farm.role_pids().get(role, []) if pid != old]

            wait_for(lambda: bool(new()) or farm.proc.poll() is not None, 30, f"no new {role}")  # type: ignore[union-attr]
            assert farm.proc is not None and farm.proc.poll() is None, farm.fail(f"up exited instead of a new {role}")
            return new()[0]

        for role in ("gateway", "scheduler") * 3:
            [old] = farm.role_pids()[role]
            workers = children_of(old) if role == "gateway" else []
            os.kill(old, signal.SIGKILL)
            replaced(role, old)
            wait_for(lambda: serves(farm), 30, f"HTTP did not come back after the {role} was killed")
            assert not any(alive(pid) for pid in workers), "the killed gateway's workers were left running"

        [redis_pid] = farm.role_pids()["redis-server"]
        os.kill(redis_pid, signal.SIGKILL)
        again = next_redis_server(farm.proc.pid, redis_pid)
        os.kill(again, signal.SIGKILL)  # as it starts, before it answers: what up waits for
        replaced("redis-server", again)
        wait_for(lambda: serves(farm), 30, lambda: farm.fail("the farm does not serve after Redis came back").args[0])
        assert farm.stop() == 0
    finally:
        farm.stop()


SLOW_CALLS = """\
deployments:
  - {name: sleepy, import_path: 'examples.sleepy:Sleepy', max_ongoing_requests: 4, graceful_shutdown_timeout_s: 20}
"""


def test_an_embedded_redis_that_dies_while_up_stops_is_restarted_for_what_still_drains(tmp_path: Path) -> None:
    """Ctrl-C, then the embedded Redis killed while the gateway drains: the calls under way still get their
    answers (they got 503: Redis was restarted only until the stop began)."""
    config = tmp_path / "sleepy.yaml"
    config.write_text(SLOW_CALLS)
    farm = Farm(config, tmp_path / "up.log")
    try:
        farm.start()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            calls = [pool.submit(farm.post, "/sleepy", {"seconds": 3}) for _ in range(3)]
            wait_for(lambda: farm.status()["sleepy"]["in_flight"] == 3, 30, "the calls did not start")
            [redis_pid] = farm.role_pids()["redis-server"]
            assert farm.proc is not None
            farm.proc.send_signal(signal.SIGINT)
            wait_for(lambda: b"stopping" in farm.log(), 10, "up did not begin to stop")
            os.kill(redis_pid, signal.SIGKILL)
            answers = [call.result(timeout=60) for call in calls]
        assert [(a.status_code, a.json()) for a in answers] == [(200, {"slept": 3})] * 3, farm.log()[-3000:]
        assert b"the embedded redis-server died; restarting it" in farm.log()
    finally:
        farm.stop()
