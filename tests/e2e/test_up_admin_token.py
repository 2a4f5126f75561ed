"""`streamserve up` with no STREAMSERVE_API_KEY: a private token in its data directory, which admin writes need; the
commands run beside it find the farm; replicas never see the token; a web page on another origin cannot deploy.
"""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.browser import CHROMIUM, Browser
from tests.harness.farm import Farm, running_farm_of
from tests.harness.paths import STREAMSERVE
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: env
    import_path: tests.deployments:streamserve_environment
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: env-ext
    import_path: tests.deployments:started_environment
    external_scaler_enabled: true
    graceful_shutdown_timeout_s: 2
"""
PWN = '{"deployments":[{"name":"pwn","import_path":"os:system"}]}'


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("admin-token")) as farm:
        yield farm


def test_up_makes_a_private_token_and_says_where_it_is(farm: Farm) -> None:
    token_file = farm.data_dir / "api_key"
    assert token_file.stat().st_mode & 0o777 == 0o600
    banner = farm.log().decode()
    assert f"token in {token_file} (mode 0600)" in banner
    assert f'-H "Authorization: Bearer $(cat {token_file})"' in banner

    deploy = f"{farm.base_url}/-/deploy"
    refused = httpx.post(deploy, content=PWN, headers={"Content-Type": "application/json"}, timeout=10)
    assert refused.status_code == 401, refused.text
    wrong = httpx.post(deploy, content=PWN, headers={**farm.admin_headers(), "Content-Type": "text/plain"}, timeout=10)
    assert wrong.status_code == 415, wrong.text
    assert "pwn" not in farm.status()


def test_commands_run_beside_up_find_the_farm(farm: Farm, tmp_path: Path) -> None:
    """No --redis-url, no REDIS_URL: the data directory says where the farm's Redis is (its default name too)."""
    env = {k: v for k, v in farm.env().items() if k != "REDIS_URL" and not k.startswith("STREAMSERVE_")}

    def status(*args: str, cwd: Path) -> str:
        done = run_command([STREAMSERVE, "status", *args], cwd, env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "env" in status("--data-dir", str(farm.data_dir), cwd=tmp_path)
    (tmp_path / ".streamserve").symlink_to(farm.data_dir)  # the default: .streamserve where the command runs
    assert "env" in status(cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lost = run_command([STREAMSERVE, "status"], elsewhere, {**env, "REDIS_URL": "redis://127.0.0.1:1/0"})
    assert lost.returncode == 1 and "127.0.0.1:1" in lost.stderr  # REDIS_URL wins over any data directory
    nowhere = run_command([STREAMSERVE, "status", "--data-dir", str(elsewhere)], elsewhere, env)
    # A data directory named that no farm runs from is an error, not the default Redis (another farm's, maybe).
    assert nowhere.returncode == 1 and f"no `streamserve up` runs from {elsewhere}/ (--data-dir)" in nowhere.stderr


def run_command(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_replicas_never_see_the_token(farm: Farm) -> None:
    names = farm.post("/env", None).json()
    assert "REDIS_URL" in names, names  # the replica got its settings...
    assert "STREAMSERVE_API_KEY" not in names, names  # ...but not the gateway's secret
    token = (farm.data_dir / "api_key").read_text().strip()
    for pid, argv in farm.processes().items():
        environ = Path(f"/proc/{pid}/environ").read_bytes() if Path(f"/proc/{pid}/environ").exists() else b""
        if "worker" in argv or "scheduler" in argv:
            assert token.encode() not in environ, argv


def test_a_worker_started_with_the_gateway_s_secrets_starts_again_without_them(farm: Farm, tmp_path: Path) -> None:
    """A worker run by hand (or by a unit sharing the gateway's environment) with the API key and the tenant keys:
    neither is in the environment its user code can read, /proc/self/environ included."""
    env = {**farm.env(), "REDIS_URL": farm.effective_redis_url}
    env |= {"STREAMSERVE_API_KEY": "the-gateway-secret", "STREAMSERVE_TENANT_KEYS": str(tmp_path / "tenant-keys")}
    with subprocess.Popen(
        [farm.command, "worker", "env-ext"], cwd=farm.cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as worker:
        try:
            answer = farm.post("/env-ext", None, headers={"X-Request-Timeout": "20"})
            assert answer.status_code == 200, answer.text
            names = answer.json()
            assert "REDIS_URL" in names and "STREAMSERVE_API_KEY" not in names, names
            assert "STREAMSERVE_TENANT_KEYS" not in names, names
        finally:
            worker.terminate()
            worker.wait(30)


ATTACK_PAGE = """<!doctype html><html><body>
<form id="form" method="POST" enctype="text/plain" action="{gateway}/-/deploy" target="sink">
  <input name='{{"deployments":[{{"name":"pwnform","import_path":"os:system","x":"' value='"}}]}}'>
</form>
<iframe name="sink"></iframe>
<script>
window.results = [];
async function attack() {{
  const body = '{pwn}';
  try {{
    const plain = {{"Content-Type": "text/plain"}};
    await fetch("{gateway}/-/deploy", {{method: "POST", mode: "no-cors", headers: plain, body}});
    window.results.push("simple request sent");
  }} catch (e) {{ window.results.push("simple request failed: " + e); }}
  try {{
    const json = {{"Content-Type": "application/json"}};
    const r = await fetch("{gateway}/-/deploy", {{method: "POST", headers: json, body}});
    window.results.push("json request answered " + r.status);
  }} catch (e) {{ window.results.push("json request blocked"); }}
  document.getElementById("form").submit();
  window.done = true;
}}
attack();
</script></body></html>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium to drive: install Debian's chromium package")
def test_a_web_page_on_another_origin_cannot_deploy(farm: Farm) -> None:
    page = ATTACK_PAGE.format(gateway=farm.base_url, pwn=PWN).encode()

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        with Browser() as browser:
            assert browser.open(f"http://127.0.0.1:{server.server_address[1]}/") == 200
            browser.wait_for("window.done === true", 20)
            results = browser.evaluate("window.results")
            # The page's requests reached the gateway, which turned them away (the access log says so).
            wait_for(lambda: farm.log().decode().count("POST /-/deploy 403") >= 2, 20, f"not refused: {results}")
            # The dashboard, in the same browser on the gateway's own origin, keeps working.
            assert browser.open(f"{farm.base_url}/-/dashboard") == 200
            browser.wait_for("document.querySelector('tr[data-deployment=\"env\"]') !== null", 20)
    finally:
        server.shutdown()
        server.server_close()
    assert not {"pwn", "pwnform"} & set(farm.status()), results
    assert "json request answered" not in str(results), "the browser let the page read the gateway's answer"
