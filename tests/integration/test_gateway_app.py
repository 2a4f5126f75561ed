"""The gateway app in-process (ASGI client) in front of an in-process replica and the real redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from streamserve.runtime.settings import Settings
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy, gateway_http


async def wait_for_routes(http: httpx.AsyncClient, timeout_s: float = 10.0) -> None:
    """The gateway learns new deployments by long poll: wait (bounded) until it has some."""

    async def some_route() -> bool:
        return bool((await http.get("/-/routes")).json())

    await wait_for_async(some_route, timeout_s, "gateway never saw the deployment")


async def test_post_returns_result_and_headers(start_replica: StartReplica, http: httpx.AsyncClient) -> None:
    replica = await start_replica(route_prefix="/rec")
    resp = await http.post("/rec", json={"x": [1, 2, 3]}, headers={"X-Request-ID": "abc-1"})
    assert resp.status_code == 200
    assert resp.json()["body"] == {"x": [1, 2, 3]}
    assert resp.headers["x-request-id"] == "abc-1"
    assert resp.headers["x-deployment"] == "rec"
    assert resp.headers["x-replica"] == replica.replica_id.to_str()
    made = await http.post("/rec/sub/path", content=b"")
    assert made.status_code == 200 and made.json()["body"] is None
    assert len(made.headers["x-request-id"]) == 16


async def test_errors(start_replica: StartReplica, http: httpx.AsyncClient, settings: Settings) -> None:
    await start_replica(route_prefix="/rec")
    not_found = await http.post("/nothing", json=1)
    assert not_found.status_code == 404 and not_found.json()["error"] == "NotFoundError"
    bad_json = await http.post("/rec", content=b"{nope")
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["message"]
    latin1 = await http.post("/rec", content='{"name": "Zoë"}'.encode("latin-1"))
    assert latin1.status_code == 400
    assert latin1.json()["message"] == "request body is not UTF-8 (JSON text is): byte 0xeb at offset 12"
    for value in ("soon", "0", "-1", "nan", "inf", "1e400", "1_0", "+2", "", "0e5", "1e", "0x10"):
        bad_timeout = await http.post("/rec", json=1, headers={"X-Request-Timeout": value})
        assert bad_timeout.status_code == 400 and "X-Request-Timeout" in bad_timeout.json()["message"], value
    for value in ("2", "2.5", ".5", "1e1", "1.5E0"):  # an exponent is a number of seconds too
        assert (await http.post("/rec", json=1, headers={"X-Request-Timeout": value})).status_code == 200, value
    two = await http.post("/rec", json=1, headers=[("X-Request-Timeout", "1"), ("X-Request-Timeout", "2")])
    assert two.status_code == 400 and "one X-Request-Timeout header" in two.json()["message"], two.text
    bad_id = await http.post("/rec", json=1, headers={"X-Request-ID": "a b"})
    assert bad_id.status_code == 400
    for header in ("X-Priority", "X-Tenant", "X-Model-Id"):  # one value or none: two are no answer to pick from
        twice = await http.post("/rec", json=1, headers=[(header, "high"), (header, "low")])
        assert twice.status_code == 400 and f"one {header} header" in twice.json()["message"], twice.text
    for path in ("/rec", "/-/nothing"):  # which id is the request's? (the first answers the error)
        twice = await http.request("POST", path, json=1, headers=[("X-Request-ID", "a-1"), ("X-Request-ID", "b-2")])
        assert twice.status_code == 400 and twice.headers["x-request-id"] == "a-1", twice.text
        assert twice.json()["message"] == "a request takes one X-Request-ID header, got 2", twice.text
    # Spaces and tabs around a value are no part of it (RFC 9110, 5.5): the server drops them.
    for header, padded in (
        ("X-Priority", "high \t"),
        ("X-Model-Id", "m1 "),
        ("X-Tenant", "\tacme "),
    ):
        answered = await http.post("/rec", json=1, headers=[(header, padded.encode())])
        assert answered.status_code == 200, (header, answered.text)
    accented = await http.post("/rec", json=1, headers=[("X-Priority", "lów".encode())])
    assert accented.status_code == 400 and "'lów'" in accented.json()["message"], accented.text  # as sent (UTF-8)
    # A long bad value is named by its start and its length, not repeated whole (headers may hold 64 KiB).
    long = "1" + "0" * 30_000 + "x"
    for header in ("X-Request-Timeout", "Idempotency-Key", "X-Tenant", "X-Model-Id", "X-Priority"):
        refused = await http.post("/rec", json=1, headers={header: long})
        message = refused.json()["message"]
        assert refused.status_code == 400 and len(refused.content) < 1000, (header, len(refused.content))
        assert header in message or header.lower().removeprefix("x-").replace("-", " ") in message, message
        assert "100000" in message and "(30002 characters)" in message, message


async def test_routes_and_health(start_replica: StartReplica, http: httpx.AsyncClient) -> None:
    await start_replica(route_prefix="/rec")
    assert (await http.get("/-/healthz")).json() == {"status": "ok"}
    assert (await http.get("/-/routes")).json() == {"/rec": "rec"}
    status = (await http.get("/-/status")).json()
    assert [d["name"] for d in status["deployments"]] == ["rec"]
    assert status["endpoints"] == []


async def test_no_replica_and_scaled_to_zero(http: httpx.AsyncClient, settings: Settings) -> None:
    await deploy(settings, num_replicas=0, route_prefix="/zero")
    await wait_for_routes(http)
    resp = await http.post("/zero", json=1)
    assert resp.status_code == 503
    assert resp.json()["error"] == "UnavailableError"


async def test_deadline_gives_504(http: httpx.AsyncClient, settings: Settings) -> None:
    await deploy(settings, route_prefix="/slow")  # deployed, but no replica takes it
    await wait_for_routes(http)
    resp = await http.post("/slow", json=1, headers={"X-Request-Timeout": "0.2"})
    assert resp.status_code == 504
    assert resp.json()["error"] == "RequestTimeoutError"


@pytest.fixture
async def guarded_http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway_http(settings.model_copy(update={"api_key": SecretStr("s3cret")})) as client:
        yield client


CONFIG = {"deployments": [{"name": "adm", "import_path": "examples.functions:noop", "num_replicas": 1}]}


async def test_admin_writes_need_the_api_key_when_one_is_set(guarded_http: httpx.AsyncClient) -> None:
    refused = await guarded_http.post("/-/deploy", json=CONFIG)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    wrong = await guarded_http.post("/-/deploy", json=CONFIG, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = await guarded_http.post("/-/deploy", json=CONFIG, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    goal_id = ok.json()["goals"]["adm"]
    goal = await guarded_http.get(f"/-/goals/{goal_id}")  # reads stay open
    assert goal.status_code == 200 and goal.json()["status"] == "PENDING"
    assert (await guarded_http.delete("/-/deployments/adm")).status_code == 401
    scaled = await guarded_http.post(
        "/-/deployments/adm/scale", json={"num_replicas": 2}, headers={"Authorization": "bearer  s3cret"}
    )
    assert scaled.status_code == 200  # the scheme is case-insensitive (RFC 7235)
    deleted = await guarded_http.delete("/-/deployments/adm", headers={"X-API-Key": "s3cret"})
    assert deleted.status_code == 200 and deleted.json()["goal_id"]


async def test_admin_api_validates_input(http: httpx.AsyncClient) -> None:
    bad = await http.post("/-/deploy", json={"deployments": [{"name": "x", "import_path": "nocolon"}]})
    assert bad.status_code == 400
    assert "import_path" in bad.json()["message"]
    assert (await http.post("/-/deploy", content=b"{")).status_code == 400
    # A number a config cannot hold exactly is refused, as the CLI refuses it (it was deployed as a float).
    big = b'{"deployments": [{"name": "adm", "import_path": "examples.functions:noop", "user_config": {"n": '
    inexact = await http.post("/-/deploy", content=big + b"123456789012345678901234567890}}]}")
    assert inexact.status_code == 400 and "cannot be carried exactly" in inexact.json()["message"], inexact.text
    assert (await http.post("/-/deploy", json=CONFIG)).status_code == 200  # no key configured: open
    assert (await http.post("/-/deployments/adm/scale", json={"num_replicas": -1})).status_code == 400
    misspelt = await http.post("/-/deployments/adm/scale", json={"num_replicas": 2, "num_replica": 5})
    assert misspelt.status_code == 400 and "and nothing else" in misspelt.json()["message"], misspelt.text
    scaled = await http.post("/-/deployments/adm/scale", json={"num_replicas": 3})
    assert scaled.status_code == 200 and scaled.json()["goal_id"]
    assert (await http.post("/-/deployments/nope/scale", json={"num_replicas": 1})).status_code == 404
    assert (await http.get("/-/goals/nope")).status_code == 404
    assert (await http.get("/-/goals/x?wait=100")).status_code == 400


async def test_every_error_has_our_shape(start_replica: StartReplica, settings: Settings) -> None:
    await start_replica(route_prefix="/rec")
    async with gateway_http(settings.model_copy(update={"max_request_bytes": 1000})) as http:
        await wait_for_routes(http)
        wrong_method = await http.get("/rec")
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
        assert wrong_method.json()["error"] == "MethodNotAllowedError"
        assert wrong_method.json()["request_id"] == wrong_method.headers["x-request-id"]
        traced = await http.request("TRACE", "/rec")
        assert traced.status_code == 405 and traced.headers["allow"] == "POST"
        for method in ("PROPFIND", "CONNECT", "QUERY"):  # beyond HTTP's own methods: they were 404
            other = await http.request(method, "/rec")
            assert other.status_code == 405 and other.headers["allow"] == "POST", (method, other.text)
            assert other.json()["request_id"] == other.headers["x-request-id"]
        assert (await http.request("PROPFIND", "/nothing")).status_code == 404
        nowhere = await http.delete("/nothing")
        assert nowhere.status_code == 404 and nowhere.json()["error"] == "NotFoundError"
        for method in ("POST", "PUT", "DELETE"):  # the gateway's own path, though not under /-/
            not_metrics = await http.request(method, "/metrics")
            assert not_metrics.status_code == 405 and not_metrics.headers["allow"] == "GET, HEAD", (
                method,
                not_metrics.text,
            )
        bad_id = await http.post("/rec", json=1, headers={"X-Request-ID": "a b"})
        assert bad_id.status_code == 400 and "X-Request-ID" in bad_id.json()["message"]
        assert bad_id.json()["request_id"] == bad_id.headers["x-request-id"] != "a b"
        too_big = await http.post("/rec", content=b"[" + b"1," * 600 + b"1]")
        assert too_big.status_code == 413 and "max_request_bytes (1000)" in too_big.json()["message"]

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit holds while it streams
            for _ in range(20):
                yield b" " * 100

        streamed = await http.post("/rec", content=chunked())
        assert streamed.status_code == 413 and "max_request_bytes (1000)" in streamed.json()["message"]
        admin_too_big = await http.post("/-/deploy", content=b" " * 2000 + b"{}")
        assert admin_too_big.status_code == 413 and admin_too_big.json()["error"] == "PayloadTooLargeError"
        bad_param = await http.get("/-/goals/x?wait=abc")
        assert bad_param.status_code == 400 and bad_param.json()["error"] == "BadRequestError"
        assert "wait" in bad_param.json()["message"]
