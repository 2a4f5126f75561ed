"""A handler that raises what no handler should (SystemExit, KeyboardInterrupt, its own CancelledError or
BaseException, an exception whose ``str()`` raises) gets its caller an error reply naming what it raised, at once,
and its replica serves on: the same process, its one slot free again. Before, an async or batched handler's SystemExit
ended the replica (and the request ran again on the next, and the next), a CancelledError or a BaseException of its
own left the request unanswered until its deadline, and an unprintable exception held the replica's slot for ever.

docs/api.md: "An exception in a handler becomes an error reply with its type and message ... the replica keeps
serving"; "A reconfigure that raises refuses it: that replica keeps serving with the one before".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamserve import Client
from streamserve.wire.errors import DeadLetterError, RemoteError
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

DEPLOYMENTS = """
deployments:
  - name: unruly
    import_path: tests.unruly_deployments:Unruly
    num_replicas: 1
    max_ongoing_requests: 1
    user_config: {exit: false}
    graceful_shutdown_timeout_s: 5
  - name: unruly-batched
    import_path: tests.unruly_deployments:batched
    num_replicas: 1
    graceful_shutdown_timeout_s: 5
  - name: unruly-async-batched
    import_path: tests.unruly_deployments:async_batched
    num_replicas: 1
    graceful_shutdown_timeout_s: 5
  - name: unruly-stream
    import_path: tests.unruly_deployments:stream
    num_replicas: 1
    graceful_shutdown_timeout_s: 5
  - name: unruly-crash
    import_path: tests.unruly_deployments:crash
    num_replicas: 1
    max_delivery_attempts: 1
    graceful_shutdown_timeout_s: 5
"""
# What the body names -> the error type its caller is told.
RAISED = {
    "exit": "SystemExit",
    "interrupt": "KeyboardInterrupt",
    "cancelled": "CancelledError",
    "own": "OwnBase",
    "unprintable": "Unprintable",
}
# Far below the deployments' request_timeout_s (30 s): an error reply, not a deadline.
ANSWER_S = 10


@pytest.fixture(scope="module")
def unruly(farm: Farm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    config = tmp_path_factory.mktemp("unruly") / "unruly.yaml"
    config.write_text(DEPLOYMENTS)
    farm.cli("deploy", str(config), "--wait", "--timeout", "60")
    try:
        yield config
    finally:
        for name in ("unruly", "unruly-batched", "unruly-async-batched", "unruly-stream", "unruly-crash"):
            farm.cli("delete", name, check=False)


@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("unruly", ""),
        ("unruly", "sync"),
        ("unruly", "via_coroutine"),
        ("unruly-batched", ""),
        ("unruly-async-batched", ""),
    ],
)
def test_what_a_handler_raises_is_its_callers_error_and_its_replica_serves_on(
    unruly: Path, client: Client, name: str, method: str
) -> None:
    pid = client.call(name, None, method=method, timeout=ANSWER_S)
    for body, error_type in RAISED.items():
        with pytest.raises(RemoteError) as raised:
            client.call(name, body, method=method, timeout=ANSWER_S)
        assert raised.value.error_type == error_type, (body, raised.value)
        if body == "unprintable":
            assert "its message cannot be shown" in raised.value.message
        # The same process answers the next call (unruly has one slot: it was freed).
        assert client.call(name, None, method=method, timeout=ANSWER_S) == pid, body


def test_what_a_streaming_handler_raises_ends_its_stream_and_its_replica_streams_on(
    unruly: Path, client: Client
) -> None:
    pid = list(client.stream("unruly-stream", None, timeout=ANSWER_S))[1]
    for body, error_type in RAISED.items():
        chunks = []
        with pytest.raises(RemoteError) as raised:
            for chunk in client.stream("unruly-stream", body, timeout=ANSWER_S):
                chunks.append(chunk)
        assert chunks == ["first"] and raised.value.error_type == error_type, (body, raised.value)
        assert list(client.stream("unruly-stream", None, timeout=ANSWER_S)) == ["first", pid], body


def test_a_reconfigure_that_calls_sys_exit_refuses_the_user_config_and_the_replica_serves_on(
    unruly: Path, farm: Farm, client: Client, tmp_path: Path
) -> None:
    pid = client.call("unruly", None, timeout=ANSWER_S)
    exiting = tmp_path / "exit.yaml"
    exiting.write_text(unruly.read_text().replace("user_config: {exit: false}", "user_config: {exit: true}"))
    farm.cli("deploy", str(exiting))

    def refused() -> bool:
        replicas = farm.status()["unruly"]["replicas"]
        return any("refused the new user_config (SystemExit: 9)" in r.get("message", "") for r in replicas)

    wait_for(refused, 30, lambda: f"the refusal was not told: {farm.status()['unruly']}")
    assert client.call("unruly", None, timeout=ANSWER_S) == pid
    farm.cli("deploy", str(unruly))


def test_a_replica_killed_by_a_signal_is_named_so_in_its_logs_and_status(
    unruly: Path, farm: Farm, client: Client
) -> None:
    """A segfault leaves the replica nothing to say: the scheduler says it, where the user looks."""
    with pytest.raises(DeadLetterError):
        client.call("unruly-crash", "segv", timeout=ANSWER_S)
    told = "is dead: process killed by SIGSEGV]"
    wait_for(lambda: told in farm.cli("logs", "unruly-crash", "-n", "50").stdout, 30, "the death was not logged")
    message = farm.status()["unruly-crash"]["message"]
    assert "replaced dead replica unruly-crash#" in message and "killed by SIGSEGV" in message, message
