"""The gateway's HTTP surface: 405 with Allow for its own routes, every error in one shape, a valid OpenAPI document."""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/-/deploy", "POST"),
        ("GET", "/-/deploy", "POST"),
        ("HEAD", "/-/status", "GET"),
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
    assert (await http.get("/-/docs")).status_code == 200
