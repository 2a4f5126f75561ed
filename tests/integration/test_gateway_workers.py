"""``streamserve gateway --workers N``: N gateway processes on one port, each with its own reply stream; a worker
that dies is started again; a bad N is a usage error; one that cannot start makes the gateway exit non-zero."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from uvicorn.config import STARTUP_FAILURE

from streamserve.app.main import WORKER_HEALTHCHECK_S
from streamserve.runtime.processes import free_port, port_is_free
from tests.harness.farm import Processes, descendants, gateway_process
from tests.harness.paths import STREAMSERVE
from tests.harness.waiting import Message, wait_for, wait_for_async
from tests.integration.conftest import StartReplica

# Longer than uvicorn's own default worker health-check timeout (5 s) and its check's interval together.
PAUSE_S = 7.0
ACCESS_PID = re.compile(rb"\[streamserve\.access (\d+)\]")


def workers_of(supervisor: int) -> set[int]:
    """The gateway processes uvicorn's supervisor runs (its spawned children, not multiprocessing's helpers)."""
    return {pid for pid, argv in descendants(supervisor).items() if b"spawn_main" in argv}


def gateway_pid(port: int) -> int:
    """The pid of the process listening on ``port`` (uvicorn's supervisor) from /proc/net/tcp's socket inode."""
    inode = next(
        line.split()[9]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A"
    )
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            holds = any(
                os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]" for fd in os.listdir(f"/proc/{pid}/fd")
            )
            if holds and b"spawn_main" not in Path(f"/proc/{pid}/cmdline").read_bytes():  # workers hold it too
                return int(pid)
        except OSError:
            continue
    raise AssertionError(f"nothing listens on {port}")


async def until(condition: Callable[[], bool], timeout_s: float, message: Message) -> None:
    """``wait_for`` off the event loop (the test's in-process replica runs on it)."""
    await asyncio.to_thread(wait_for, condition, timeout_s, message)


async def reply_streams(aredis: aioredis.Redis) -> int:
    return len([k async for k in aredis.scan_iter(match="streamserve:replies:*")])


async def test_two_workers_share_the_port_each_with_its_reply_stream(
    start_replica: StartReplica, aredis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path, "--workers", "2") as port:
        supervisor = gateway_pid(port)
        await until(lambda: len(workers_of(supervisor)) == 2, 20, lambda: f"not two workers: {descendants(supervisor)}")
        workers = workers_of(supervisor)

        async def a_reply_stream_each() -> bool:  # each worker made its own at start
            return await reply_streams(aredis) == 2

        await wait_for_async(a_reply_stream_each, 10, "not one reply stream per worker", interval_s=0.1)

        async def post_each_on_a_new_connection(count: int) -> None:
            for i in range(count):
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    response = await http.post("/rec", json=i)
                    assert response.status_code == 200 and response.json()["body"] == i

        await asyncio.gather(*(post_each_on_a_new_connection(25) for _ in range(8)))
        log = b"".join(p.read_bytes() for p in tmp_path.glob("gateway-*.log"))
        assert {int(pid) for pid in ACCESS_PID.findall(log)} == workers  # both served

        # A worker that answers nothing for longer than uvicorn's 5 s health check (a host starved of CPU, a long
        # pause) is not killed with what it holds: it serves on once it runs again.
        paused = max(workers)
        os.kill(paused, signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE_S)  # the fault itself lasts this long
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile: the assertion below says so
                os.kill(paused, signal.SIGCONT)
        await post_each_on_a_new_connection(10)
        assert workers_of(supervisor) == workers, "a paused worker was killed and replaced"

        # A worker that dies is started again by the supervisor, and the port keeps answering meanwhile. Dead while the
        # supervisor awaits its health-check answer, it is seen only when that wait times out.
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        replaced = "the dead worker was not started again"
        within_s = WORKER_HEALTHCHECK_S + 30
        await until(
            lambda: len(workers_of(supervisor)) == 2 and victim not in workers_of(supervisor), within_s, replaced
        )
        await post_each_on_a_new_connection(10)
        workers = workers_of(supervisor)
        # Stopping the gateway (SIGTERM to its first process) stops every worker: seen here, before the block's end
        # cleans up whatever is left.
        os.kill(supervisor, signal.SIGTERM)
        gone = "the workers outlived the gateway"
        await until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 15, gone)


async def test_a_gateway_killed_9_takes_its_workers_with_it(
    start_replica: StartReplica, redis_url: str, tmp_path: Path
) -> None:
    """uvicorn's supervisor cannot stop its workers when it is killed -9: they end by themselves, and the port is free
    for the next gateway (they kept serving it for ever)."""
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path, "--workers", "2") as port:
        supervisor = gateway_pid(port)
        await until(lambda: len(workers_of(supervisor)) == 2, 20, lambda: f"not two workers: {descendants(supervisor)}")
        workers = workers_of(supervisor)
        os.kill(supervisor, signal.SIGKILL)

        def alive() -> list[int]:
            return [pid for pid in workers if Path(f"/proc/{pid}").exists()]

        await until(lambda: not alive(), 30, lambda: f"workers outlived their killed gateway: {alive()}")
        assert port_is_free("127.0.0.1", port)


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_a_bad_worker_count_is_a_usage_error(bad: str, redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    for command in (["gateway", "--workers", bad], ["up", "examples/streamserve.yaml", "--gateway-workers", bad]):
        done = subprocess.run([STREAMSERVE, *command], env=env, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 2, done.stderr
        assert "workers" in done.stderr and ("at least 1" in done.stderr or "not a whole number" in done.stderr)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_gateway_that_cannot_reach_redis_says_so_and_exits_non_zero(workers: str) -> None:
    """With --workers N too: uvicorn's supervisor ends when a worker fails to start, and the gateway exits 3 as a
    single process does (it exited 0, as if stopped on purpose), saying why in one line, without a traceback."""
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}  # nothing listens there
    command = [STREAMSERVE, "gateway", "--port", str(free_port()), "--workers", workers]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == STARTUP_FAILURE, done.stderr
    assert "gateway: cannot reach Redis at redis://127.0.0.1:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "Application startup failed" not in done.stderr, done.stderr  # (the one line says why)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_gateway_whose_up_is_gone_tries_its_last_redis_operations_once_in_every_worker(
    workers: int, redis_url: str, tmp_path: Path
) -> None:
    """`up` killed -9 closes its lifeline: the gateway's way out then tries each Redis operation once (its callers'
    cancellations, retried against a Redis gone with `up`, held it 10 s). Workers spawned by multiprocessing do not
    hold the lifeline: their supervisor tells them."""
    processes = Processes(redis_url, tmp_path)
    read_fd, write_fd = os.pipe()
    try:
        port = free_port()
        with processes.log("gateway").open("wb") as log:
            processes.started["gateway"] = subprocess.Popen(
                [STREAMSERVE, "gateway", "--port", str(port), "--workers", str(workers)],
                env={**processes.env(), "STREAMSERVE_LIFELINE_FD": str(read_fd)},
                pass_fds=(read_fd,),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        os.close(read_fd)

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/-/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 30, lambda: f"the gateway did not start:\n{processes.log('gateway').read_text()[-2000:]}")
        if workers > 1:
            supervisor = gateway_pid(port)
            wait_for(lambda: len(workers_of(supervisor)) == workers, 20, "not every worker started")
        os.close(write_fd)  # `up` is gone
        write_fd = -1

        def told() -> int:
            return processes.log("gateway").read_text().count("started it is gone; what it still does")

        wait_for(lambda: told() == workers, 20, lambda: f"{told()} of {workers} gateway processes heard of it")
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        processes.stop_all()


def test_a_gateway_stopped_with_ctrl_c_exits_0_without_a_traceback(processes: Processes) -> None:
    """uvicorn raises a Ctrl-C again once it has shut down: `streamserve gateway` printed a KeyboardInterrupt
    traceback and exited 130 (found by a review)."""
    gateway = processes.start_gateway()
    gateway.proc.send_signal(signal.SIGINT)
    assert gateway.proc.wait(30) == 0, gateway.log.read_text()
    output = gateway.log.read_text()
    assert "KeyboardInterrupt" not in output and "Traceback" not in output, output
