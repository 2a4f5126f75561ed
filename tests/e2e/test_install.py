"""The wheel, installed (not editable) into a fresh venv, beside a user project with generic package names.

streamserve must install one import name and start every process as ``python -m streamserve <role>``: a user's
own ``app/``, ``workers/``, ``scheduler/`` or ``examples/`` package is exactly what the farm runs next to.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamserve import __version__
from tests.harness.farm import Farm, pids_with_marker
from tests.harness.paths import ROOT
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

USER_PACKAGES = ("app", "workers", "scheduler", "examples")


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def dockerfile_copies() -> list[str]:
    """The paths docker/Dockerfile's COPY lines take from the build context (the repository root)."""
    paths: list[str] = []
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _destination = line.split()[1:]
            paths.extend(source.rstrip("/") for source in sources)
    return paths


def test_the_dockerfile_copies_every_source_folder() -> None:
    assert set(dockerfile_copies()) >= {"pyproject.toml", "README.md", "src", "app", "workers", "scheduler"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout, installed as a user would (deps from the index)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from what docker/Dockerfile copies, and nothing else: a source folder its COPY lines miss fails here,
    # not in a user's image build (no Docker engine runs in CI). A copy also keeps build/ out of the checkout.
    source = tmp / "source"
    for path in dockerfile_copies():
        if (ROOT / path).is_dir():
            shutil.copytree(ROOT / path, source / path, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / path, source / path)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(source)], tmp)
    (wheel,) = tmp.glob("streamserve-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp)
    run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", str(wheel)], tmp)
    return venv


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user project whose own packages are called app, workers, scheduler and examples."""
    for name in USER_PACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'the user project {name}'\n")
    (tmp_path / "app" / "model.py").write_text(
        "from workers import WHO\n\ndef predict(body):\n    return {'ok': body, 'workers': WHO}\n"
    )
    (tmp_path / "cfg.yaml").write_text(
        "deployments:\n  - name: predict\n    import_path: app.model:predict\n    num_replicas: 1\n"
    )
    return tmp_path


def test_the_wheel_installs_one_import_name(venv: Path, tmp_path: Path) -> None:
    python = str(venv / "bin" / "python")
    for name in USER_PACKAGES:
        result = subprocess.run([python, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 1 and f"No module named '{name}'" in result.stderr, result.stderr
    top_level = run([python, "-c", "import streamserve.app, streamserve.workers, streamserve.scheduler"], tmp_path)
    assert top_level.returncode == 0
    files = run([str(venv / "bin" / "pip"), "show", "-f", "streamserve"], tmp_path).stdout
    roots = {line.strip().split("/")[0] for line in files.split("Files:")[1].splitlines() if line.strip()}
    # ".." is the console script in the venv's bin/, outside site-packages.
    assert {r for r in roots if not r.endswith(".dist-info")} - {".."} == {"streamserve"}, roots


def test_version_and_usage_exit_codes(venv: Path, tmp_path: Path) -> None:
    streamserve = str(venv / "bin" / "streamserve")
    version = run([streamserve, "--version"], tmp_path)
    assert version.stdout.strip() == f"streamserve {__version__}"
    usage = subprocess.run([streamserve, "no-such-command"], cwd=tmp_path, capture_output=True, text=True)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    module = run([str(venv / "bin" / "python"), "-m", "streamserve", "--version"], tmp_path)
    assert module.stdout.strip() == f"streamserve {__version__}"


# A user's program, checked with mypy --strict against the installed wheel: one line right, one wrong.
USER_PROGRAM = """\
import streamserve
from streamserve import Client


def queue(client: Client) -> str:
    return client.send("echo", {"x": 1})


def wrong(client: Client) -> int:
    return client.send("echo", {"x": 1})


class Models:
    # The decorators keep the functions' types: mypy --strict says nothing of an untyped decorator.
    @streamserve.multiplexed(max_models_per_replica=2)
    async def get_model(self, model_id: str) -> dict[str, str]:
        return {"id": model_id}

    @streamserve.batch(max_batch_size=8)
    async def __call__(self, bodies: list[str]) -> list[dict[str, str]]:
        return [await self.get_model(body) for body in bodies]


@streamserve.multiplexed
def load(model_id: str) -> str:
    return model_id
"""


def test_a_user_program_is_type_checked_against_the_installed_package(venv: Path, tmp_path: Path) -> None:
    """The wheel is a typed package (PEP 561, its py.typed): mypy reads its annotations, and does not report it
    installed "but missing library stubs or py.typed marker"."""
    (tmp_path / "program.py").write_text(USER_PROGRAM)
    mypy = [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(venv / "bin" / "python")]
    checked = subprocess.run([*mypy, "program.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert checked.stdout.splitlines() == [
        'program.py:10: error: Incompatible return value type (got "str", expected "int")  [return-value]',
        "Found 1 error in 1 file (checked 1 source file)",
    ], checked.stdout


@pytest.fixture(params=["wheel", "editable"])
def user_farm(request: pytest.FixtureRequest, project: Path) -> Iterator[Farm]:
    """``up`` in a user project's folder: from the wheel's venv, and from this checkout's editable install (the
    four source folders reached through setuptools' import hook, with the repository nowhere on the path)."""
    if request.param == "wheel":
        command = request.getfixturevalue("venv") / "bin" / "streamserve"
    else:
        command = Path(sys.executable).parent / "streamserve"
    farm = Farm(project / "cfg.yaml", project / "up.log", command=str(command), cwd=project)
    farm.start()
    try:
        yield farm
    finally:
        farm.stop()


def test_up_serves_a_user_app_package(user_farm: Farm) -> None:
    wait_for(lambda: user_farm.status()["predict"]["running"] == 1, 60, "the replica did not start")
    response = user_farm.post("/predict", {"x": 1})
    assert response.status_code == 200, response.text
    assert response.json() == {"ok": {"x": 1}, "workers": "the user project workers"}
    commands = _command_lines(user_farm)
    for role in ("gateway", "scheduler", "worker predict"):
        assert any(f" -m streamserve {role}" in c for c in commands), commands
    assert user_farm.stop() == 0


def _command_lines(farm: Farm) -> list[str]:
    """The command lines of every process the farm started."""
    lines = []
    for pid in pids_with_marker(farm.token):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return lines
