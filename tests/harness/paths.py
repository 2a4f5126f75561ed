"""Where the tests and benches find things: the checkout, and the ``streamserve`` command of this virtualenv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAMSERVE = str(Path(sys.executable).with_name("streamserve"))


def python_path() -> str:
    """PYTHONPATH for a child: the repository root first, so that it imports ``tests``, ``bench`` and ``examples``
    from here."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
