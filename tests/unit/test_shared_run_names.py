"""The names shared runs go by: a deployment's cache scope follows its config, and run tokens never repeat."""

from __future__ import annotations

import os

from streamserve.wire import shared_runs
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.response_cache import cache_digest


def test_a_deploy_that_changes_user_config_or_code_changes_every_cache_digest() -> None:
    first = DeploymentConfig(name="classify", import_path="x:y", user_config={"threshold": 0.5})
    digest = cache_digest(first, "", b'{"text":"hi"}')
    assert cache_digest(first, "", b'{"text": "hi"}') == digest  # the same JSON value, asked again
    changed = first.model_copy(update={"user_config": {"threshold": 0.7}})
    assert cache_digest(changed, "", b'{"text":"hi"}') != digest
    recoded = DeploymentConfig(name="classify", import_path="x:z", user_config={"threshold": 0.5})
    assert cache_digest(recoded, "", b'{"text":"hi"}') != digest
    # An equal config, as a new deploy of the same settings makes it: the same digest (the cache still answers).
    assert cache_digest(DeploymentConfig.model_validate(first.model_dump()), "", b'{"text":"hi"}') == digest
    assert cache_digest(first, "", b'{"text":"hi"}') == digest  # back to the first config object


def test_run_tokens_do_not_repeat_in_a_process_or_across_a_fork() -> None:
    tokens = {shared_runs.new_run_token() for _ in range(10_000)}
    assert len(tokens) == 10_000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next token, to the parent
        os.close(read)
        os.write(write, shared_runs.new_run_token().encode())
        os._exit(0)
    os.close(write)
    child_token = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = shared_runs.new_run_token()
    assert child_token and child_token != mine and child_token not in tokens
    assert child_token.split("-")[0] != mine.split("-")[0]  # the child counts under a prefix of its own
