"""mypy --strict over the installed layout: ``python -m tests.harness.typecheck [MYPY_ARGS...]``.

The four source folders install as one package, ``streamserve`` (src/streamserve, with app/, workers/ and
scheduler/ as its subpackages). mypy cannot follow setuptools' editable import hook, so this builds that package as
a tree of symbolic links in a temporary folder and checks it there; the paths mypy prints are mapped back to the
checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.paths import ROOT

ROLES = ("app", "workers", "scheduler")


def link_tree(into: Path) -> Path:
    """``into/streamserve``: the core's entries and the role folders, each a link to the checkout's own."""
    package = into / "streamserve"
    package.mkdir()
    for entry in (ROOT / "src" / "streamserve").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for role in ROLES:
        (package / role).symlink_to(ROOT / role)
    return package


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="streamserve-typecheck-") as tmp:
        package = link_tree(Path(tmp))
        result = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *argv, str(package)],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
    output = result.stdout + result.stderr
    for role in ROLES:
        output = output.replace(f"streamserve/{role}/", f"{role}/")
    sys.stdout.write(output.replace("streamserve/", "src/streamserve/"))
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
