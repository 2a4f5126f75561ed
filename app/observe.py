"""What the gateway does once a request is answered: count it in the farm's metrics, write its access line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import TextIO

from streamserve.metrics.definitions import REQUEST_DURATION, REQUESTS, TENANT_REQUESTS
from streamserve.metrics.figures import Figures
from streamserve.wire.printable import printable

access_logger = logging.getLogger("streamserve.access")

# The status logged for a caller that went away before its answer (nginx's "client closed request").
CLIENT_CLOSED = 499
# Access lines are written together: at most this long after the first one waits, or once this many wait.
ACCESS_FLUSH_S = 0.05
ACCESS_FLUSH_LINES = 256


class RequestObserver:
    """Counts answered requests (when ``figures`` is given) and writes one access line each (when ``access_log``).

    In the text log format the line is built here, in the shape of every other log line (runtime.logging_setup), and
    written in batches: through the logging module a line cost the gateway a fifth of its throughput
    (bench/observability_bench.py). The JSON format goes through the logging module and its JSON formatter.
    """

    def __init__(self, figures: Figures | None, access_log: bool, log_format: str = "text") -> None:
        self.figures = figures
        self.access_log = access_log
        self._lines = _AccessLines(sys.stderr) if access_log and log_format == "text" else None

    def done(
        self,
        method: str,
        path: str,
        status: int,
        started: float,
        request_id: str,
        deployment: str,
        replica: str,
        tenant: str = "",
        trace_id: str = "",
    ) -> None:
        """``started``: time.perf_counter() when the request arrived; ``deployment`` "" when none was matched;
        ``tenant`` "" when none was known (the request was refused before its tenant was); ``trace_id`` "" when
        the gateway does not trace."""
        seconds = time.perf_counter() - started
        if self.figures is not None and deployment:
            self.figures.count(deployment, REQUESTS, str(status))
            self.figures.observe(deployment, REQUEST_DURATION, seconds)
            if tenant:
                self.figures.count_field(deployment, TENANT_REQUESTS.field(tenant, status))
        if not self.access_log:
            return
        if self._lines is not None:
            self._lines.write(method, path, status, seconds, request_id, deployment, replica, trace_id)
            return
        duration_ms = round(seconds * 1000, 2)
        access_logger.info(
            "%s %s %d %.2fms deployment=%s replica=%s",
            method,
            path,
            status,
            duration_ms,
            deployment or "-",
            replica or "-",
            extra={
                "request_id": request_id,
                "method": method,
                "path": path,
                "status": status,
                "duration_ms": duration_ms,
                "deployment": deployment,
                "replica": replica,
                **({"trace_id": trace_id} if trace_id else {}),
            },
        )

    def flush(self) -> None:
        if self._lines is not None:
            self._lines.flush()


# One access line as noted: time.time(), method, path, status, seconds, request id, deployment, replica, trace id.
_Noted = tuple[float, str, str, int, float, str, str, str, str]


class _AccessLines:
    """Access lines in the text log format, kept briefly as tuples and formatted and written to ``stream`` a batch at
    a time: a request costs the gateway a tuple, its line is made with the others of its batch after the response."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending: list[_Noted] = []
        self._head = f" INFO    [{access_logger.name} {os.getpid()}] "
        self._second = -1
        self._stamp = ""

    def write(
        self,
        method: str,
        path: str,
        status: int,
        seconds: float,
        request_id: str,
        deployment: str,
        replica: str,
        trace_id: str = "",
    ) -> None:
        """Note one line: ``seconds`` the request took."""
        self._pending.append((time.time(), method, path, status, seconds, request_id, deployment, replica, trace_id))
        if len(self._pending) == 1:
            asyncio.get_running_loop().call_later(ACCESS_FLUSH_S, self.flush)
        elif len(self._pending) >= ACCESS_FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            lines = "".join([self._line(entry) for entry in pending])
            try:
                self._stream.write(lines)
                self._stream.flush()
            except (OSError, ValueError):  # stderr closed or gone: the lines are lost, the request is not
                pass

    def _line(self, entry: _Noted) -> str:
        now, method, path, status, seconds, request_id, deployment, replica, trace_id = entry
        second = int(now)
        if second != self._second:  # logging's asctime, made once a second
            self._second, self._stamp = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        # Escaped (wire.printable) as one: the caller's path and request id cannot forge a line or reach a terminal
        # as control sequences. Only a line with a control character in it costs more than a scan. The path's spaces
        # (decoded from %20) as they were sent: a path cannot forge the fields after it ("/x 200 1ms deployment=a").
        if " " in path:
            path = path.replace(" ", "%20")
        line = (
            f"{self._stamp},{int((now - second) * 1000):03d}{self._head}{method} {path} {status} "
            f"{seconds * 1000:.2f}ms deployment={deployment or '-'} replica={replica or '-'} "
            f"request_id={request_id or '-'}"
        )
        if trace_id:
            line += f" trace_id={trace_id}"
        return printable(line) + "\n"
