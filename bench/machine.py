"""The machine a run measured on, and how busy other work kept it: cores, CPU model, load, CPU time."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import resource
import time
from pathlib import Path


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {cpu_model()}, {platform.system()} {platform.release()}"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has spent, all cores together (from /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped (and theirs): the bench's own work."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class RunLoad:
    """How busy the machine was with other work while a run measured.

    The load average after a run mostly shows the run itself (it keeps both cores busy), so the verdict
    "busy machine" comes from the load average before the run and from the CPU that processes other than
    the bench's own used during it: all CPU time of the machine less this process's and its reaped
    children's. (A grandchild orphaned on the way out is not counted as ours: a small overestimate.)
    """

    def __init__(self) -> None:
        self.before = loadavg()
        self._t0, self._busy0, self._own0 = time.monotonic(), machine_busy_s(), own_cpu_s()
        self.after = ""
        self.other_cores = math.nan  # cores used by other work, on average over the run

    def finish(self) -> RunLoad:
        wall = time.monotonic() - self._t0
        other = (machine_busy_s() - self._busy0) - (own_cpu_s() - self._own0)
        self.after = loadavg()
        self.other_cores = max(0.0, other) / wall if wall > 0 else math.nan
        return self
