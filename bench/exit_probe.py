"""How long a streamserve process takes to end once its work is done: a job worker from SIGTERM (it has no job) to
its exit, split at its last log line, and a whole ``streamserve status`` against a farm's Redis. Run against the
code checked out, on an embedded redis-server of its own; alternate checkouts to compare.

    .venv/bin/python -m bench.exit_probe [N]
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

from streamserve.runtime.embedded_redis import EmbeddedRedis

# As `up` starts its roles (runtime/processes.role_command), whatever the console script of the checkout.
STREAMSERVE = [sys.executable, "-m", "streamserve"]


def job_worker_exit(env: dict[str, str]) -> tuple[float, float]:
    """Seconds from SIGTERM to the job worker's last log line, and from that line to its end."""
    proc = subprocess.Popen([*STREAMSERVE, "job-worker"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "serving queue" in line:
                break
        time.sleep(1.0)  # RQ sets its signal handlers as its work loop starts, a moment after that line
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        last_line = signalled
        for line in proc.stderr:
            if ": exited" in line:
                last_line = time.monotonic()
        proc.wait()
        return last_line - signalled, time.monotonic() - last_line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def status_command(env: dict[str, str]) -> float:
    """Seconds a whole ``streamserve status`` takes."""
    started = time.monotonic()
    subprocess.run([*STREAMSERVE, "status"], env=env, capture_output=True, check=True)
    return time.monotonic() - started


def main(n: int) -> None:
    redis = EmbeddedRedis().start()
    try:
        env = {**os.environ, "REDIS_URL": redis.url}
        exits = [job_worker_exit(env) for _ in range(n)]
        statuses = [status_command(env) for _ in range(n)]
    finally:
        redis.stop()
    to_log = statistics.median(e[0] for e in exits) * 1000
    to_end = statistics.median(e[1] for e in exits) * 1000
    print(
        f"job worker: SIGTERM -> last log line {to_log:.0f} ms, last log line -> exit {to_end:.0f} ms (median of {n})"
    )
    print(f"streamserve status: {statistics.median(statuses) * 1000:.0f} ms (median of {n})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
