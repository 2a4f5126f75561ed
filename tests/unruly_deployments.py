"""Handlers that raise what no handler should: a BaseException that is no Exception, their own CancelledError, an
exception whose ``str()`` raises (imported by replicas as ``tests.unruly_deployments:...``). Each must get its caller
an error reply, and leave its replica serving."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import streamserve


class OwnBase(BaseException):
    """A BaseException of the user's own (as some libraries define for aborts)."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str failed")


RAISED: dict[str, BaseException] = {
    "exit": SystemExit(3),
    "interrupt": KeyboardInterrupt(),
    "cancelled": asyncio.CancelledError(),
    "own": OwnBase("own abort"),
    "unprintable": Unprintable(),
}


class Unruly:
    """``__call__`` (async) and ``sync`` raise what the body names; a body naming nothing returns the replica's pid."""

    async def __call__(self, body: Any) -> int:
        return _raise_or_pid(body)

    def sync(self, body: Any) -> int:
        return _raise_or_pid(body)

    def via_coroutine(self, body: Any) -> Any:
        """A plain def that returns a coroutine (as a decorator's wrapper may): the replica runs that too."""
        return self(body)

    def reconfigure(self, config: dict[str, Any]) -> None:
        if config.get("exit"):
            sys.exit(9)


@streamserve.batch(max_batch_size=4, batch_wait_timeout_s=0.01)
def batched(bodies: list[Any]) -> list[int]:
    """A sync batched handler: raises what a body names, for the whole batch."""
    for body in bodies:
        _raise_or_pid(body)
    return [os.getpid()] * len(bodies)


@streamserve.batch(max_batch_size=4, batch_wait_timeout_s=0.01)
async def async_batched(bodies: list[Any]) -> list[int]:
    """An async batched handler: raises what a body names, for the whole batch."""
    return [_raise_or_pid(body) for body in bodies]


def _raise_or_pid(body: Any) -> int:
    if isinstance(body, str) and body in RAISED:
        raise RAISED[body]
    return os.getpid()


def crash(body: Any) -> int:
    """Kills its own process with SIGSEGV, as a segfault in native code does, for the body "segv"."""
    if body == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    return os.getpid()


async def stream(body: Any) -> Any:
    """An async generator: one chunk, then raises what the body names."""
    yield "first"
    _raise_or_pid(body)
    yield os.getpid()
