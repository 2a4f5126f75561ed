"""The disk under the embedded Redis's data fills up: Redis refuses every write (MISCONF: it cannot write its
append-only file), as a Redis out of memory does. Callers get 503 saying why, no process exits, and once the disk
has room again the farm serves, with nothing restarted.

A small tmpfs is the full disk: mounting one needs root (the test is skipped without it)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - name: echo
    import_path: tests.deployments:whoami
    num_replicas: 2
"""
DISK_BYTES = 32 * 2**20


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A small file system of its own, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system (a disk to fill) needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def farm(tmp_path: Path, disk: Path) -> Iterator[Farm]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    farm = Farm(config, tmp_path / "up.log", data_dir=disk / "data").start()
    try:
        wait_for(lambda: farm.status()["echo"]["running"] == 2, 60, "the replicas did not come up")
        yield farm
    finally:
        farm.stop()


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte with one file, and return it."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def call(farm: Farm, n: int) -> httpx.Response:
    return httpx.post(f"{farm.base_url}/echo", json={"n": n}, headers={"X-Request-Timeout": "3"}, timeout=30)


def test_a_full_disk_refuses_calls_with_the_reason_and_the_farm_serves_once_it_has_room(farm: Farm, disk: Path) -> None:
    assert call(farm, 0).status_code == 200
    roles = farm.role_pids()
    filler = fill(disk)
    answers: list[httpx.Response] = []

    def refused() -> bool:  # (a call Redis took before its disk filled may still be answered, or time out)
        answers.append(call(farm, len(answers)))
        return answers[-1].status_code == 503

    wait_for(refused, 30, lambda: f"no call was refused: {[(a.status_code, a.text) for a in answers[-3:]]}")
    error = answers[-1].json()
    assert error["error"] == "OverloadedError" and "cannot write its persistence files" in error["message"], error
    # The scheduler's lock renewal is refused too: it keeps the lead (nobody can take it), and with it the job workers.
    scheduler_refused = b"[streamserve.scheduler.scheduler"
    wait_for(
        lambda: any(scheduler_refused in line and b"persistence files" in line for line in farm.log().splitlines()),
        30,
        "the scheduler never met the full disk",
    )
    assert b"lost leadership" not in farm.log()
    assert farm.role_pids() == roles  # nothing exited, nothing was restarted

    filler.unlink()
    wait_for(lambda: call(farm, -1).status_code == 200, 30, "the farm did not serve once the disk had room")
    assert farm.role_pids() == roles
    assert b"Traceback" not in farm.log()
