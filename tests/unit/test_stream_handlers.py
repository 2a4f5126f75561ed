"""Streaming handlers without Redis: the loader tells them (generators and async generators) from the rest and
refuses batched ones; ``max_unread_chunks`` is checked where a config is written."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamserve.cli import main as cli
from streamserve.control.security import ImportAllowList
from streamserve.wire.config import DeploymentConfig, parse_config
from streamserve.wire.errors import ConfigError
from streamserve.workers.loader import LoadedDeployment, is_stream, load
from tests import stream_deployments


def gen(body: Any) -> Iterator[Any]:
    yield body


async def agen(body: Any) -> AsyncIterator[Any]:
    yield body


def plain(body: Any) -> Any:
    return body


async def coroutine(body: Any) -> Any:
    return body


def returns_a_generator(body: Any) -> Iterator[Any]:
    """Not a generator function itself: it is not detected (a handler streams by being one)."""
    return iter([body])


class SyncCall:
    def __call__(self, body: Any) -> Iterator[Any]:
        yield body


class AsyncCall:
    async def __call__(self, body: Any) -> AsyncIterator[Any]:
        yield body


@pytest.mark.parametrize(
    ("fn", "streams"),
    [
        (gen, True),
        (agen, True),
        (functools.partial(gen), True),
        (SyncCall(), True),
        (AsyncCall(), True),
        (stream_deployments.Tokens().spell, True),
        (plain, False),
        (coroutine, False),
        (returns_a_generator, False),
        (stream_deployments.Tokens().unary, False),
        (len, False),
    ],
)
def test_a_generator_or_async_generator_function_streams(fn: Any, streams: bool) -> None:
    assert is_stream(fn) is streams


def test_handlers_say_whether_they_stream_and_where_they_run() -> None:
    tokens = LoadedDeployment(stream_deployments.Tokens(), is_class=True)
    call, spell, unary = tokens.handler(""), tokens.handler("spell"), tokens.handler("unary")
    assert call.is_stream and not call.is_async  # a sync generator: on a handler thread
    assert spell.is_stream and spell.is_async  # an async generator: on the loop
    assert not unary.is_stream and not unary.is_async
    assert LoadedDeployment(agen, is_class=False).handler("").is_async
    assert not LoadedDeployment(coroutine, is_class=False).handler("").is_stream


@pytest.mark.parametrize(
    ("attr", "named"), [("BatchedStream", "BatchedStream.predict"), ("batched_generator", "batched_generator")]
)
def test_a_batched_generator_is_refused_at_load(attr: str, named: str) -> None:
    cfg = DeploymentConfig.model_validate({"name": "b", "import_path": f"tests.stream_deployments:{attr}"})
    with pytest.raises(ConfigError) as refused:
        load(cfg, ImportAllowList())
    message = str(refused.value)
    assert named in message
    assert "@streamserve.batch generator: a batched handler cannot stream" in message


def test_the_other_stream_deployments_load() -> None:
    for attr in ("Tokens", "count_to", "acount_to"):
        cfg = DeploymentConfig.model_validate({"name": "s", "import_path": f"tests.stream_deployments:{attr}"})
        assert load(cfg, ImportAllowList()).handler("").is_stream


def test_max_unread_chunks_defaults_to_64() -> None:
    cfg = DeploymentConfig.model_validate({"name": "s", "import_path": "tests.stream_deployments:count_to"})
    assert cfg.max_unread_chunks == 64


@pytest.mark.parametrize("value", [0, -1])
def test_max_unread_chunks_below_1_is_a_config_error_naming_the_field(value: int) -> None:
    body = {
        "deployments": [{"name": "s", "import_path": "tests.stream_deployments:count_to", "max_unread_chunks": value}]
    }
    with pytest.raises(ConfigError) as refused:
        parse_config(body, "request body")
    assert "deployment 's' (deployments[0]): max_unread_chunks: Input should be greater than or equal to 1" in str(
        refused.value
    )


def test_the_cli_exits_2_on_max_unread_chunks_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "farm.yaml"
    config.write_text(
        "deployments:\n  - name: s\n    import_path: tests.stream_deployments:count_to\n    max_unread_chunks: 0\n"
    )
    assert cli.main(["deploy", str(config)]) == 2
    assert "deployment 's' (deployments[0]): max_unread_chunks: " in capsys.readouterr().err
