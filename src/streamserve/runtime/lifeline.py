"""A lifeline from `streamserve up` to every process it starts, however far down: a pipe whose write end only `up`
holds and never writes.

When `up` dies, by any signal, SIGKILL included, the kernel closes that write end and every read end becomes
readable at end-of-file at once. A replica learns of it without polling, and whatever process reaped `up` or not:
a killed `up` that its parent has not waited for yet stays a zombie in /proc, but its file descriptors are closed.

`up` passes the read end to the scheduler (``pass_fds``), which passes it on to each replica it starts; its number
travels in the settings (``lifeline_fd``). Replicas are in sessions of their own, so that they outlive a scheduler
that crashes (a restarted one adopts them); the lifeline ties them to `up` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import stat
import threading
from collections.abc import Callable

# How long a replica or job worker whose `up` died drains: its Redis is likely gone with it, and nobody will stop it.
FARM_GONE_DRAIN_S = 5.0
# How long all of such a process's exit after that drain may take (its last writes, to a Redis likely gone too).
FARM_GONE_WIND_DOWN_S = 2.0
# How long a gateway of `up` answers what it holds once told to stop: `up` waits this long for it on Ctrl-C, and a
# gateway whose `up` died (the kernel sends it SIGTERM) takes no longer either.
UP_GATEWAY_DRAIN_S = 10.0
# How long `up` then gives it to end what it still serves: cancelled, in the replicas too (a stream's generator is
# closed there, as for a caller who left), and its connections closed. Killed at once with its drain, it cancelled
# nothing, and a replica draining for the scheduler after it ran that stream to the end of its own drain.
UP_GATEWAY_EXIT_S = 5.0
# What `up` sends its scheduler as it begins to stop, before its gateway drains: no job is to start any more (the job
# workers finish what they run; what is queued waits for the next farm). `up` starts the scheduler with it blocked
# (hold_stop_jobs_signal), so that one sent while the scheduler starts waits for it (by default it ends a process).
STOP_JOBS_SIGNAL = signal.SIGUSR1
# What a gateway's supervisor (``--workers N``) sends each of its workers once `up` is gone: multiprocessing spawned
# them, holding no descriptor but its own, so the lifeline is the supervisor's alone.
FARM_GONE_SIGNAL = signal.SIGUSR2


def hold_stop_jobs_signal() -> None:
    """In the scheduler's preexec_fn: block STOP_JOBS_SIGNAL. A blocked signal stays pending across exec, until the
    scheduler takes it (scheduler/stop_signals.JobsStopSignal)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_JOBS_SIGNAL})


class Lifeline:
    """Held by `up`: the pipe. ``read_fd`` goes to its children; the write end stays here, unwritten, until exit."""

    def __init__(self) -> None:
        # Both ends are close-on-exec (os.pipe's default): only a child given ``read_fd`` in pass_fds has it, and no
        # child ever holds the write end, or `up`'s death would not close the pipe.
        self.read_fd, self._write_fd = os.pipe()

    def close(self) -> None:
        for fd in (self.read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def inherited(fd: int | None) -> int | None:
    """``fd`` if it is a pipe this process holds (a lifeline handed down), else None: a number copied in the
    environment without the descriptor may name some other file here, or nothing."""
    if fd is None:
        return None
    try:
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except OSError:
        return None


def watch(fd: int, on_cut: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_cut`` once, on the running loop, when the lifeline's write end is closed; returns ``unwatch``."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)

    def readable() -> None:
        if not is_cut(fd):
            return  # nobody writes to it; a byte that came anyway is read and ignored rather than spun on
        loop.remove_reader(fd)
        on_cut()

    def unwatch() -> None:
        loop.remove_reader(fd)

    loop.add_reader(fd, readable)
    return unwatch


def is_cut(fd: int) -> bool:
    """Whether the lifeline's write end is closed now (``up`` is gone), without waiting: the pipe reads as its end
    (or as an error); a byte somebody wrote is taken and ignored."""
    try:
        readable, _, _ = select.select([fd], [], [], 0)
        return bool(readable) and os.read(fd, 1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def watch_from_thread(fd: int, on_cut: Callable[[], None]) -> threading.Thread:
    """Call ``on_cut`` once, on a daemon thread of its own, when the lifeline's write end is closed: for a process
    whose main thread is not an event loop (a job worker, inside RQ)."""

    def wait() -> None:
        while True:
            select.select([fd], [], [])  # the descriptor may be non-blocking: it is shared with the scheduler's
            if is_cut(fd):
                on_cut()
                return

    thread = threading.Thread(target=wait, name="lifeline", daemon=True)
    thread.start()
    return thread
