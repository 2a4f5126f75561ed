"""An OTLP/HTTP sink for the tracing bench: takes every ``POST /v1/traces`` and answers 200 with an empty
ExportTraceServiceResponse (zero bytes of protobuf), decoding nothing, so that what it costs the machine is
reading the bytes. Runs as a process of its own: ``python -m bench.otlp_sink PORT``."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's session expects

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str]) -> int:
    server = ThreadingHTTPServer(("127.0.0.1", int(argv[0])), _Sink)
    print(f"otlp sink listening on {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
