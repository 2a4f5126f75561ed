"""Deployments used by the tests (imported by replicas as ``tests.deployments:...``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import streamserve
from tests.harness.waiting import wait_for, wait_for_async

HOLD_S = 20.0  # how long a call with ``{"wait_for": PATH}`` waits for PATH at most
CALLS: list[Any] = []  # bodies seen by Recorder in this process (for in-process replicas)
CALLS_BY_TAG: Counter[str] = Counter()  # how many calls each Recorder tag ran in this process


class Recorder:
    """Records every body it runs; ``boom`` raises a user error."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.config: Any = None

    def reconfigure(self, user_config: Any) -> None:
        self.config = user_config

    def __call__(self, body: Any) -> dict[str, Any]:
        CALLS.append(body)
        CALLS_BY_TAG[self.tag] += 1
        return {"tag": self.tag, "body": body, "config": self.config}

    def boom(self, body: Any) -> None:
        raise ValueError(f"boom: {body}")

    def as_float(self, body: Any) -> float:
        """``"nan"`` or ``"inf"`` make a result that JSON has no form for."""
        return float(body)

    def nested(self, depth: int) -> Any:
        value: Any = []
        for _ in range(depth):
            value = [value]
        return value


class Awkward:
    """Handlers whose outcome is not a plain return value; ``__call__`` echoes."""

    def __call__(self, body: Any) -> Any:
        return body

    def not_json(self, body: Any) -> Any:
        return {body}  # a set

    async def no_body(self) -> None:
        """Declared without the body parameter: calling it raises TypeError before it can be awaited."""

    def lazy(self, body: Any) -> Any:
        """A sync method that hands back a coroutine (as a partial of an async function would)."""

        async def later() -> Any:
            await asyncio.sleep(0)
            return {"later": body}

        return later()


class Rendezvous:
    """Sync handler that only returns once ``parties`` calls run at the same time (else it times out)."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=10)

    def __call__(self, body: Any) -> int:
        return self.barrier.wait()


GATE = asyncio.Event()  # opened by a test (in the same process as an in-process replica) to let Gate handlers return


async def gate(body: Any) -> Any:
    """Async handler that returns its body once the test opens GATE."""
    await GATE.wait()
    return body


async def gated_recorder(body: Any) -> Any:
    """Records its body in CALLS, then returns it once the test opens GATE."""
    CALLS.append(body)
    await GATE.wait()
    return body


OVERRUN_GATE = threading.Event()  # set by a test to let ``overrun`` return


def overrun(body: Any) -> Any:
    """Sync handler that records its body in CALLS, then returns it once the test sets OVERRUN_GATE (at most HOLD_S):
    it runs on past its deadline as a sync handler may."""
    CALLS.append(body)
    OVERRUN_GATE.wait(HOLD_S)
    return body


class FailingConstructor:
    def __init__(self) -> None:
        raise RuntimeError("weights not found")


def pid(body: Any) -> int:
    """Returns the replica's pid."""
    return os.getpid()


def crash_on(body: Any) -> Any:
    """Kills its own process (as a segfaulting model would) on "crash", or ``{"crash_after": S}`` seconds.

    ``{"sleep": S, ...}`` echoes the body after S seconds; anything else is echoed at once.
    """
    if body == "crash":
        os._exit(3)
    if isinstance(body, dict) and "crash_after" in body:
        time.sleep(body["crash_after"])
        os._exit(3)
    if isinstance(body, dict) and "sleep" in body:
        time.sleep(body["sleep"])
    return body


class Tally:
    """Appends one line per call to ``path``, so a test can count calls made in replica processes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, body: Any) -> None:
        with open(self.path, "a") as tally:
            tally.write("call\n")


# -- batching -------------------------------------------------------------------------

# Sizes of the batches the batched deployments below ran in this process (for in-process replicas).
BATCH_SIZES: list[int] = []
BATCH_BODIES: list[Any] = []  # every body the batched deployments below ran in this process


def _seen(bodies: list[Any]) -> None:
    BATCH_SIZES.append(len(bodies))
    BATCH_BODIES.extend(bodies)


class BatchedModel:
    """A class whose ``__call__`` (sync) and ``predict`` (async) take batches."""

    @streamserve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
    def __call__(self, bodies: list[Any]) -> list[dict[str, Any]]:
        _seen(bodies)
        return [{"in": body, "size": len(bodies)} for body in bodies]

    @streamserve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
    async def predict(self, bodies: list[Any]) -> list[dict[str, Any]]:
        _seen(bodies)
        return [{"in": body, "size": len(bodies)} for body in bodies]


BATCH_MODELS: list[tuple[str, int]] = []  # (model id, batch size) of each batch BatchedModels ran


class BatchedModels:
    """Batches and many models: each batch is of one model's requests, and model_id() in it names that model."""

    @streamserve.multiplexed(max_models_per_replica=2)
    def get_model(self, model_id: str) -> dict[str, str]:
        return {"id": model_id}

    @streamserve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
    def __call__(self, bodies: list[Any]) -> list[dict[str, Any]]:
        model = self.get_model(streamserve.model_id())
        BATCH_MODELS.append((model["id"], len(bodies)))
        return [{"in": body, "model": model["id"]} for body in bodies]


@streamserve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
async def batched_fn(bodies: list[Any]) -> list[dict[str, Any]]:
    """An async function that takes batches."""
    _seen(bodies)
    return [{"in": body, "size": len(bodies)} for body in bodies]


@streamserve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
def batched_short(bodies: list[Any]) -> list[Any]:
    """A buggy batch handler: one output too few."""
    _seen(bodies)
    return bodies[:-1]


@streamserve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
def batched_boom(bodies: list[Any]) -> list[Any]:
    """Raises for the whole batch when any body is "bad"."""
    _seen(bodies)
    if "bad" in bodies:
        raise ValueError("one bad input in the batch")
    return bodies


@streamserve.batch(max_batch_size=8, batch_wait_timeout_s=60)
async def batched_patient(bodies: list[Any]) -> list[Any]:
    """Waits up to a minute for a full batch (a drain must not wait for it)."""
    _seen(bodies)
    return bodies


# -- deadlines and backpressure (run as real processes by tests/e2e/test_load.py) --------


SLOW_ECHO_S = 0.05


async def slow_echo(body: Any) -> Any:
    """Returns its body after ``SLOW_ECHO_S``: a slow deployment whose queue fills up."""
    await asyncio.sleep(SLOW_ECHO_S)
    return body


def _hold(body: dict[str, Any]) -> None:
    """Until the file ``body["wait_for"]`` exists, if the body names one; HOLD_S at most, then it runs anyway."""
    if "wait_for" in body:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: os.path.exists(body["wait_for"]), HOLD_S, interval_s=0.01)


class Ledger:
    """Records the id of every body it runs; ``seen`` returns them. ``{"wait_for": PATH}`` holds until PATH exists."""

    def __init__(self) -> None:
        self.ran: list[Any] = []

    async def __call__(self, body: dict[str, Any]) -> Any:
        self.ran.append(body.get("id"))
        if "wait_for" in body:
            with contextlib.suppress(AssertionError):  # held long enough: it runs anyway
                await wait_for_async(lambda: os.path.exists(body["wait_for"]), HOLD_S, interval_s=0.01)
        return body.get("id")

    def seen(self, body: Any) -> list[Any]:
        return self.ran


class Stopwatch:
    """A sync handler that sleeps ``{"sleep": S}`` seconds and says when it ran; ``user_config`` sets its greeting.

    Returns ``{"greeting", "pid", "started", "ended"}`` (``time.time()``), so a test can see which calls overlapped.
    """

    def __init__(self) -> None:
        self.greeting = ""

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.greeting = user_config.get("greeting", "")

    def __call__(self, body: Any) -> dict[str, Any]:
        started = time.time()
        time.sleep(float(body.get("sleep", 0)) if isinstance(body, dict) else 0)
        return {"greeting": self.greeting, "pid": os.getpid(), "started": started, "ended": time.time()}


def whoami(body: Any) -> dict[str, Any]:
    """Which worker ran the call (host, pid, the GPUs it may use); ``{"wait_for": PATH}`` holds it until PATH
    exists (20 s at most)."""
    if isinstance(body, dict):
        _hold(body)
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": gpus, "body": body}


def append_line(body: dict[str, Any]) -> str:
    """Appends ``body["line"]`` to the file ``body["path"]`` (a side effect a test can count after restarts);
    ``{"wait_for": PATH}`` first holds until PATH exists (20 s at most)."""
    _hold(body)
    with open(body["path"], "a") as out:
        out.write(f"{body['line']}\n")
    return str(body["line"])


def chatty(body: Any) -> Any:
    """Prints what it got (to stdout), and raises when asked to: output for `streamserve logs`."""
    print(f"chatty got {body!r}")
    if body == "raise":
        raise RuntimeError("chatty was asked to raise")
    return body


class Picky:
    """Answers with the tag of its user_config; its reconfigure() refuses the tag ``bad``, and takes a second over a
    tag that starts with ``slow``."""

    def __init__(self) -> None:
        self.tag = None

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        if user_config.get("tag") == "bad":
            raise ValueError("the tag 'bad' is not allowed")
        if str(user_config.get("tag")).startswith("slow"):
            time.sleep(1)
        self.tag = user_config.get("tag")

    def __call__(self, body: Any) -> Any:
        return {"tag": self.tag}


class NeedsFile:
    """Cannot start until the file ``path`` exists: a start failure that goes away (a volume mounted late, say)."""

    def __init__(self, path: str) -> None:
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing")

    def __call__(self, body: Any) -> Any:
        return body


def last_words(body: dict[str, Any]) -> None:
    """Prints a line, then says so in the file ``body["marker"]`` and waits to be killed: output just before a crash."""
    print(f"last words {body['words']}", flush=True)
    Path(body["marker"]).write_text("printed")
    time.sleep(60)


def flood(body: dict[str, Any]) -> int:
    """Prints ``body["lines"]`` lines ``flood BURST N`` (N from 0) to stdout, BURST being ``body["burst"]``: a burst
    of output for the cap on a deployment's log stream."""
    for n in range(body["lines"]):
        print(f"flood {body['burst']} {n}")
    return int(body["lines"])


class Checked:
    """A deployment with a ``check_health()`` (sync, or async with ``run_async``) that counts its calls in
    ``<marker>.calls`` and, once the file ``marker`` exists, fails once: it raises (``mode`` "raise"; the marker
    is removed, so the replacement is healthy) or hangs for ever ("hang")."""

    def __init__(self, marker: str, mode: str = "raise", run_async: bool = False) -> None:
        self.marker = Path(marker)
        self.mode = mode
        if run_async:
            self.check_health = self._check_async  # type: ignore[method-assign]

    def __call__(self, body: Any) -> Any:
        return body

    def _count(self) -> bool:
        """Count the call; whether this one should fail."""
        with Path(f"{self.marker}.calls").open("a") as calls:
            calls.write(".")
        if not self.marker.exists():
            return False
        if self.mode == "raise":
            self.marker.unlink(missing_ok=True)
        return True

    def check_health(self) -> None:
        if self._count():
            if self.mode == "hang":
                time.sleep(3600)
            raise RuntimeError("the database is gone")

    async def _check_async(self) -> None:
        if self._count():
            if self.mode == "hang":
                await asyncio.Event().wait()
            raise RuntimeError("the database is gone")


class SlowStart:
    """A constructor that takes ``seconds`` (model weights, say): the replica runs, not yet ready, for that long."""

    def __init__(self, seconds: float = 2.0) -> None:
        time.sleep(seconds)

    def __call__(self, body: Any) -> Any:
        return body


def sized(body: dict[str, Any]) -> str:
    """A string of ``body["bytes"]`` characters (its JSON two more): a result as large as a test needs;
    ``{"wait_for": PATH}`` first holds until PATH exists (20 s at most)."""
    _hold(body)
    return "x" * int(body["bytes"])


def streamserve_environment(body: Any) -> list[str]:
    """The names of the streamserve settings this replica's environment holds (what user code could read)."""
    return sorted(name for name in os.environ if name.startswith("STREAMSERVE_") or name == "REDIS_URL")


def start_sleeper(body: Any) -> int:
    """Starts a process that outlives the call, as a model server a handler starts would (in the replica's process
    group); returns its pid."""
    return subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL).pid


class GroupStarter:
    """Starts a process in its constructor and another in each call, as a model server and a pool would (both in the
    replica's process group); a call returns both pids."""

    def __init__(self) -> None:
        self.server = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL).pid

    def __call__(self, body: Any) -> list[int]:
        return [self.server, start_sleeper(body)]


def start_daemon(body: Any) -> int:
    """Starts a process detached from the replica's process group and session (a double fork and setsid, as a daemon
    does), which outlives the call; returns its pid."""
    read, write = os.pipe()
    if os.fork() == 0:  # the first child: a session of its own, then the daemon, then gone
        os.setsid()
        daemon = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
        os.write(write, str(daemon.pid).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as told:
        return int(told.read())


def started_environment(body: Any) -> list[str]:
    """The names of the variables in the environment this process started with (/proc/self/environ: what any code
    in it can read, whatever os.environ says)."""
    raw = Path("/proc/self/environ").read_bytes()
    return sorted(entry.partition(b"=")[0].decode() for entry in raw.split(b"\0") if entry)


_POOL: list[Any] = []


def pool_workers(body: Any) -> list[int]:
    """Starts a multiprocessing pool once (its workers in the replica's process group: forked, and kept at their
    number by the pool's own thread, which starts new ones as the old die); returns their pids."""
    import multiprocessing

    if not _POOL:
        _POOL.append(multiprocessing.get_context("fork").Pool(2))
    return sorted(process.pid for process in _POOL[0]._pool)


class StartsWhereLet:
    """Version 2 fails to start where TEST_CANNOT_RUN_V2 is set, and takes 2 s to start elsewhere (an externally
    scaled deployment's workers on hosts that differ: tests/e2e/test_external_scaling.py)."""

    def __init__(self, v: int = 1) -> None:
        if v >= 2:
            if os.environ.get("TEST_CANNOT_RUN_V2"):
                raise ValueError("this host cannot run v2")
            time.sleep(2)
        self.v = v

    def __call__(self, body: Any) -> dict[str, int]:
        return {"v": self.v}
