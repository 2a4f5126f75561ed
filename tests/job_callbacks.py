"""An RQ callback with an effect a test can see: it touches the path in its job's meta.

Stock RQ imports and calls a job's callbacks by the dotted name stored with the job; streamserve's job workers never
do (tests/integration/test_job_guard.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def leave_mark(job: Any, _connection: Any, *_rest: Any) -> None:
    Path(job.meta["mark"]).touch()
