"""The gateway's HTTP surface: 405 with Allow for its own routes, every error in one shape, a valid OpenAPI document."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from streamserve.app.openapi import SWAGGER_UI
from tests.harness.farm import gateway_process


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/-/deploy", "POST"),
        ("GET", "/-/deploy", "POST"),
        ("PUT", "/-/status", "GET, HEAD"),
        ("PUT", "/-/endpoints/classify", "DELETE"),
        ("GET", "/-/deployments/echo/scale", "POST"),
        ("TRACE", "/-/healthz", "GET, HEAD"),
    ],
)
async def test_a_gateway_route_asked_with_another_method_is_405_with_allow(
    http: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await http.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    if method != "HEAD":
        assert response.json()["error"] == "MethodNotAllowedError"


async def test_unknown_paths_are_404_in_the_error_shape(http: httpx.AsyncClient) -> None:
    for method, path in [("GET", "/-/nothing"), ("OPTIONS", "/nothing"), ("DELETE", "/x/y"), ("TRACE", "/x")]:
        response = await http.request(method, path)
        assert response.status_code == 404
        assert set(response.json()) >= {"error", "message"} and response.json()["error"] == "NotFoundError"
    # The gateway's own namespace is not said to be a deployment's.
    assert (await http.get("/-/jobs")).json()["message"] == "nothing is served at /-/jobs"


async def test_the_openapi_document_lists_the_gateway_routes_once_each(http: httpx.AsyncClient) -> None:
    response = await http.get("/-/openapi.json")  # warnings are errors here: a duplicate operation id would fail
    assert response.status_code == 200
    doc = response.json()
    assert all(path.startswith("/-/") or path == "/metrics" for path in doc["paths"]), list(doc["paths"])
    operation_ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))
    for path, item in doc["paths"].items():  # every {parameter} in a path is declared
        for op in item.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == {part[1:-1] for part in path.split("/") if part.startswith("{")}, (path, op)
    docs = await http.get("/-/docs")
    assert docs.status_code == 200 and f"{SWAGGER_UI}/swagger-ui-bundle.js" in docs.text  # one version of it
    # FastAPI's other pages are not served outside the gateway's /-/ (where deployment routes are).
    for page in ("/redoc", "/docs/oauth2-redirect", "/docs"):
        assert (await http.get(page)).status_code == 404, page


def heads(sock: socket.socket, count: int) -> list[bytes]:
    """The heads of ``count`` answers to HEAD: each ends at its blank line, with no body after it (a body would be
    read as the start of the next head)."""
    data = b""
    while data.count(b"\r\n\r\n") < count:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    *answers, rest = data.split(b"\r\n\r\n")
    assert rest == b"", data
    return answers


def test_head_on_the_gateways_read_routes_is_get_without_its_body(redis_url: str, tmp_path: Path) -> None:
    """RFC 9110, 9.1: a server that answers GET answers HEAD. They were 405 with Allow: GET."""
    paths = ["/-/status", "/-/routes", "/metrics", "/-/dashboard", "/-/dashboard/data", "/-/healthz", "/-/jobs/none"]
    with (
        gateway_process(redis_url, tmp_path) as port,
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
    ):
        sock.sendall(b"".join(b"HEAD %b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % p.encode() for p in paths))
        answers = heads(sock, len(paths))
    for path, head in zip(paths, answers, strict=True):
        status = b"404" if path == "/-/jobs/none" else b"200"
        assert head.startswith(b"HTTP/1.1 %b " % status), (path, head)
        assert b"\r\ncontent-length: " in head.lower(), (path, head)  # what GET's body would be
