"""The directory a farm runs in, as the place its deployments' code is imported from.

A farm's processes start with ``-P`` (runtime/processes.py, ROLE_LAUNCH): the
directory is not on ``sys.path`` while they import their own modules, so a
user's ``random.py`` there cannot shadow the standard library's. A replica puts
it first on ``sys.path`` once those imports are done, for the user's code.
"""

from __future__ import annotations

import sys
from pathlib import Path


def import_from(directory: Path) -> None:
    """Import the user's modules from ``directory`` first (its ``import_path``s are relative to it)."""
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def stdlib_namesakes(directory: Path) -> list[str]:
    """The modules and packages in ``directory`` named as a standard library module is (``code.py``, ``random.py``,
    ``email/``): where the user's code imports one of those names, it may get the other module."""
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        name = entry.stem if entry.suffix == ".py" else entry.name if (entry / "__init__.py").is_file() else ""
        if name in sys.stdlib_module_names:
            found.append(entry.name)
    return found


def namesakes_warning(directory: Path) -> str:
    """A warning about ``directory``'s namesakes of standard library modules ("" when there are none)."""
    found = stdlib_namesakes(directory)
    if not found:
        return ""
    return (
        f"{directory} holds {', '.join(found)}, named as standard library module(s): where your code imports such a "
        "name it may get the other module (rename yours)"
    )
