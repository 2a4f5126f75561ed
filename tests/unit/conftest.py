"""Unit tests touch neither Redis nor processes: this fails any test that tries."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_network_or_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("unit tests must not open sockets or start processes")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
