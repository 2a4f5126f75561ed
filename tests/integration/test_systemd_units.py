"""The systemd units in deploy/systemd/ that docs/operations.md "Running on many machines" ships: systemd takes them
without a warning, each runs a streamserve command that exists, and the worker template finds the deployment's name."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.paths import ROOT, STREAMSERVE

UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/streamserve/venv/bin/streamserve"


def installed_here(unit: Path, target: Path, instance: str | None = None) -> Path:
    """The unit as if streamserve were installed where this venv is (systemd checks that ExecStart exists)."""
    name = unit.name.replace("@.", f"@{instance}.") if instance else unit.name
    path = target / name
    path.write_text(unit.read_text().replace(INSTALLED, STREAMSERVE))
    return path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_takes_every_unit_without_a_warning(tmp_path: Path) -> None:
    units = [
        installed_here(UNITS / "streamserve-gateway.service", tmp_path),
        installed_here(UNITS / "streamserve-scheduler.service", tmp_path),
        installed_here(UNITS / "streamserve-worker@.service", tmp_path, "echo.2"),
    ]
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units)], capture_output=True, text=True, timeout=60
    )
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


def exec_start(unit: str, instance: str = "") -> list[str]:
    """ExecStart's command line after systemd's own escapes: %i is the instance, %% is %, $$ is $."""
    [line] = [line for line in (UNITS / unit).read_text().splitlines() if line.startswith("ExecStart=")]
    command = line.removeprefix("ExecStart=").replace("%i", instance).replace("%%", "%").replace("$$", "$")
    return shlex.split(command.replace(INSTALLED, STREAMSERVE))


@pytest.mark.parametrize(
    "unit", ["streamserve-gateway.service", "streamserve-scheduler.service", "streamserve-worker@.service"]
)
def test_each_unit_runs_a_streamserve_command_that_exists(unit: str) -> None:
    argv = exec_start(unit, "echo")
    if argv[0] == "/bin/sh":  # the worker template: its shell line, with --help
        argv[2] += " --help"
    else:
        argv.append("--help")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "usage: streamserve" in result.stdout, result.stderr


@pytest.mark.parametrize(
    ("instance", "deployment"), [("echo", "echo"), ("echo.2", "echo"), ("my-model.12", "my-model")]
)
def test_the_worker_template_serves_the_deployment_before_the_dot(instance: str, deployment: str) -> None:
    argv = exec_start("streamserve-worker@.service", instance)
    assert argv[:2] == ["/bin/sh", "-c"]
    shown = subprocess.run(
        [*argv[:2], argv[2].replace("exec ", "exec echo ", 1), *argv[3:]], capture_output=True, text=True, timeout=10
    )
    assert shown.stdout.split() == [STREAMSERVE, "worker", deployment]


def environment_files(unit: str) -> list[str]:
    return [line.partition("=")[2] for line in (UNITS / unit).read_text().splitlines() if line.startswith("Environ")]


def test_only_the_gateways_unit_reads_the_api_key() -> None:
    """The shared environment file is read by every unit, the workers (your code) too: the key is not in it."""
    shared, gateway_only = "/etc/streamserve/streamserve.env", "/etc/streamserve/gateway.env"
    assert environment_files("streamserve-gateway.service") == [shared, gateway_only]
    assert environment_files("streamserve-scheduler.service") == [shared]
    assert environment_files("streamserve-worker@.service") == [shared]
    assert "STREAMSERVE_API_KEY=" not in (UNITS / "streamserve.env.example").read_text()
    assert "STREAMSERVE_API_KEY=" in (UNITS / "gateway.env.example").read_text()


def test_a_worker_told_to_stop_stays_stopped() -> None:
    """A worker exits 0 when retired (one more than a scheduler-scaled deployment runs) and 1 when it cannot serve
    (its deployment not deployed): Restart=always started a retired one again every 5 s, to be retired again."""
    lines = (UNITS / "streamserve-worker@.service").read_text().splitlines()
    assert [line for line in lines if line.startswith("Restart=")] == ["Restart=on-failure"]
