"""Admin writes, as a web page would send them: a token always, the gateway's own Host, no foreign Origin, JSON.

The in-process gateway answers exactly what a real one does (the checks run before the write); the attack from a
real browser is in tests/e2e/test_browser_attack.py.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from streamserve.app.gateway import create_app
from streamserve.runtime.settings import Settings
from tests.harness.farm import gateway_process
from tests.integration.conftest import deploy
from tests.integration.test_security import stored_deployments

TOKEN = "guard-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
PWN = b'{"deployments":[{"name":"pwn","import_path":"os:system"}]}'
DEPLOY = b'{"deployments":[{"name":"ok","import_path":"examples.functions:noop"}]}'


@contextlib.asynccontextmanager
async def gateway(settings: Settings, **update: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process, its client sending nothing by itself (no token, no content type)."""
    app = create_app(settings.model_copy(update=update))
    await app.gateway.client.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000") as http:
            yield http
    finally:
        await app.gateway.client.aclose()


async def test_the_web_page_attack_of_the_issue_is_refused(settings: Settings) -> None:
    """text/plain, a foreign Origin, a rebinding Host: 403, and nothing is stored, with or without a token set."""
    hostile = {"Content-Type": "text/plain", "Origin": "http://evil.example", "Host": "rebind.evil"}
    for key in (None, SecretStr(TOKEN)):
        async with gateway(settings, api_key=key) as http:
            answer = await http.post("/-/deploy", content=PWN, headers=hostile)
            assert answer.status_code == 403, answer.text
    assert stored_deployments(settings.effective_redis_url) == set()


async def test_without_a_token_configured_admin_writes_are_refused(settings: Settings) -> None:
    async with gateway(settings) as http:
        answer = await http.post("/-/deploy", content=DEPLOY, headers=JSON)
        assert (await http.get("/-/status")).status_code == 200  # reads stay open
    assert answer.status_code == 403
    assert "need a token" in answer.json()["message"] and "STREAMSERVE_API_KEY" in answer.json()["message"]
    assert stored_deployments(settings.effective_redis_url) == set()


@pytest.mark.parametrize(
    ("host", "bind", "allowed", "status"),
    [
        ("127.0.0.1:8000", "127.0.0.1", None, 200),
        ("localhost:8000", "127.0.0.1", None, 200),
        ("[::1]:8000", "::1", None, 200),
        ("LOCALHOST.", "127.0.0.1", None, 200),
        ("rebind.evil:8000", "127.0.0.1", None, 403),  # DNS rebinding: the attacker's name, resolving to us
        ("10.1.2.3:8000", "127.0.0.1", None, 403),  # not where this gateway listens
        ("10.1.2.3:8000", "0.0.0.0", None, 200),  # a wildcard bind: any address of this machine
        ("rebind.evil:8000", "0.0.0.0", None, 403),  # ... but still no foreign name
        ("serve.example.com", "0.0.0.0", "serve.example.com, other.example", 200),
        ("rebind.evil", "127.0.0.1", "*", 200),
    ],
)
async def test_host_must_be_the_gateways_own(
    settings: Settings, host: str, bind: str, allowed: str | None, status: int
) -> None:
    async with gateway(settings, api_key=SecretStr(TOKEN), bind_host=bind, allowed_hosts=allowed) as http:
        answer = await http.post("/-/deployments/none/scale", json={"num_replicas": 0}, headers={**AUTH, "Host": host})
    expected = 404 if status == 200 else 403  # past the guard, the write itself: no such deployment
    assert answer.status_code == expected, answer.text
    if expected == 403:
        assert "STREAMSERVE_ALLOWED_HOSTS" in answer.json()["message"]


@pytest.mark.parametrize(
    ("origin", "allowed", "refused"),
    [
        (None, None, False),  # curl, the CLI, scripts: no Origin
        ("http://127.0.0.1:8000", None, False),  # the gateway's own pages
        ("http://evil.example", None, True),
        ("http://127.0.0.1:9999", None, True),  # another port is another site
        ("null", None, True),  # a sandboxed frame or a file: page
        ("https://ops.example.com", "https://ops.example.com", False),
        ("https://ops.example.com", "*", False),
    ],
)
async def test_a_browser_origin_must_be_the_gateways_own_or_allowed(
    settings: Settings, origin: str | None, allowed: str | None, refused: bool
) -> None:
    headers = {**AUTH, **({"Origin": origin} if origin else {})}
    async with gateway(settings, api_key=SecretStr(TOKEN), allowed_origins=allowed) as http:
        answer = await http.post("/-/deployments/none/scale", json={"num_replicas": 0}, headers=headers)
    assert answer.status_code == (403 if refused else 404), answer.text
    if refused:
        assert "STREAMSERVE_ALLOWED_ORIGINS" in answer.json()["message"]


async def test_a_rebinding_page_is_same_origin_but_not_our_host(settings: Settings) -> None:
    """After rebinding, the page's Origin is its own name: it matches the Host, and the Host is what gives it away."""
    headers = {**AUTH, **JSON, "Host": "rebind.evil:8000", "Origin": "http://rebind.evil:8000"}
    async with gateway(settings, api_key=SecretStr(TOKEN)) as http:
        answer = await http.post("/-/deploy", content=PWN, headers=headers)
    assert answer.status_code == 403 and "Host" in answer.json()["message"]


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_an_admin_body_must_be_json(settings: Settings, content_type: str | None) -> None:
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    async with gateway(settings, api_key=SecretStr(TOKEN)) as http:
        answer = await http.post("/-/deploy", content=DEPLOY, headers=headers)
        charset = await http.post(
            "/-/deploy", content=DEPLOY, headers={**AUTH, "Content-Type": "application/json; charset=utf-8"}
        )
        deleted = await http.delete("/-/deployments/ok", headers=AUTH)  # no body: no type needed
    assert answer.status_code == 415 and answer.json()["error"] == "UnsupportedMediaTypeError"
    assert charset.status_code == 200 and deleted.status_code == 200


async def test_the_token_is_needed_and_its_hint_says_where_it_is(settings: Settings) -> None:
    async with gateway(settings, api_key=SecretStr(TOKEN)) as http:
        missing = await http.post("/-/deploy", content=DEPLOY, headers=JSON)
        wrong = await http.post("/-/deploy", content=DEPLOY, headers={**JSON, "Authorization": "Bearer nope"})
        right = await http.post("/-/deploy", content=DEPLOY, headers={**JSON, **AUTH})
        header = await http.post("/-/deploy", content=DEPLOY, headers={**JSON, "X-API-Key": TOKEN})
    assert missing.status_code == wrong.status_code == 401
    assert ".streamserve/api_key" in missing.json()["message"]
    assert right.status_code == header.status_code == 200
    assert stored_deployments(settings.effective_redis_url) == {"ok"}


def sent(port: int, request: bytes) -> tuple[int, str]:
    """The status and error message (or body) of the answer to ``request``, sent as it is, on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    answer = orjson.loads(body)
    return int(head.split(b" ")[1]), answer.get("message", str(answer))


def scale(target: bytes, headers: bytes) -> bytes:
    """A scale of ``rec`` to 0 at ``target``, with the token, JSON and ``headers``."""
    body = b'{"num_replicas":0}'
    return b"POST %b HTTP/1.1\r\nAuthorization: Bearer %b\r\n%bContent-Length: %d\r\n\r\n%b" % (
        target,
        TOKEN.encode(),
        headers,
        len(body),
        body,
    )


async def test_headers_the_guard_goes_by_count_once_and_an_absolute_target_by_its_own_host(
    settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    """Two Host, Origin, Content-Type or Authorization headers are a 400 whatever their order (the first decided: a
    proxy may go by the other); an absolute-form target is judged by its host, not the Host header (RFC 9112, 3.2.2)."""
    await deploy(settings)
    path = b"/-/deployments/rec/scale"
    json = b"Content-Type: application/json\r\n"
    with gateway_process(redis_url, tmp_path, STREAMSERVE_API_KEY=TOKEN) as port:
        own = f"http://127.0.0.1:{port}".encode()
        for headers, header in [
            (b"Host: localhost\r\nHost: evil.example\r\n" + json, "Host"),
            (b"Host: evil.example\r\nHost: localhost\r\n" + json, "Host"),
            (b"Host: localhost\r\nOrigin: " + own + b"\r\nOrigin: http://evil.example\r\n" + json, "Origin"),
            (b"Host: localhost\r\n" + json + b"Content-Type: text/plain\r\n", "Content-Type"),
            (b"Host: localhost\r\n" + json + b"Authorization: Bearer wrong\r\n", "Authorization"),
        ]:
            status, message = sent(port, scale(path, headers))
            assert (status, message) == (400, f"an admin write takes one {header} header, got 2"), headers
        both = sent(port, scale(path, b"Host: localhost\r\nX-API-Key: wrong\r\n" + json))
        assert both == (400, "an admin write takes its token once: in Authorization or in X-API-Key, not both")
        status, message = sent(port, scale(b"http://evil.example" + path, b"Host: localhost\r\n" + json))
        assert status == 403 and "the request target's host 'evil.example'" in message, message
        assert sent(port, scale(own + path, b"Host: evil.example\r\n" + json))[0] == 200
        assert sent(port, scale(path, b"Host: localhost\r\n" + json))[0] == 200
