"""@streamserve.batch: metadata, argument checks, direct calls; the replica's Batcher on its own (no Redis)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

import streamserve
from streamserve.batching import BatchConfig, batch_config_of
from streamserve.wire.errors import BatchOutputError, ConfigError
from streamserve.wire.messages import now_ms
from streamserve.workers.batcher import IDLE_BATCHERS_KEPT, Batcher, Batchers, DeadlinePassed
from streamserve.workers.loader import LoadedDeployment


@streamserve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
def double(bodies: list[int]) -> list[int]:
    """Doubles each number."""
    return [2 * b for b in bodies]


@streamserve.batch
async def adouble(bodies: list[int]) -> list[int]:
    return [2 * b for b in bodies]


class Model:
    def __init__(self, factor: int = 3) -> None:
        self.factor = factor

    @streamserve.batch(max_batch_size=4)
    def __call__(self, bodies: list[int]) -> list[int]:
        return [self.factor * b for b in bodies]

    @streamserve.batch(max_batch_size=2, batch_wait_timeout_s=0)
    async def predict(self, bodies: list[int]) -> list[int]:
        return [self.factor * b for b in bodies]

    def plain(self, body: int) -> int:
        return body


def test_decorator_records_its_config_and_keeps_the_function_s_identity() -> None:
    assert batch_config_of(double) == BatchConfig(max_batch_size=32, batch_wait_timeout_s=0.01)
    assert batch_config_of(adouble) == BatchConfig()  # bare @batch: the defaults
    assert double.__name__ == "double" and double.__doc__ == "Doubles each number."
    assert not inspect.iscoroutinefunction(double)
    assert inspect.iscoroutinefunction(adouble)
    model = Model()
    assert batch_config_of(model) == BatchConfig(max_batch_size=4)  # an instance whose __call__ is batched
    assert batch_config_of(model.predict) == BatchConfig(max_batch_size=2, batch_wait_timeout_s=0)
    assert batch_config_of(model.plain) is None
    assert batch_config_of(len) is None


def test_the_loader_marks_batched_handlers() -> None:
    deployment = LoadedDeployment(Model(), is_class=True)
    assert deployment.handler("").batch == BatchConfig(max_batch_size=4)
    assert not deployment.handler("").is_async
    assert deployment.handler("predict").batch is not None and deployment.handler("predict").is_async
    assert deployment.handler("plain").batch is None
    assert LoadedDeployment(double, is_class=False).handler("").batch is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, got 0"),
        ({"max_batch_size": -3}, "max_batch_size must be an integer >= 1, got -3"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an integer >= 1, got 2.5"),
        ({"max_batch_size": True}, "max_batch_size must be an integer >= 1, got True"),
        ({"batch_wait_timeout_s": -0.1}, "batch_wait_timeout_s must be a number of seconds >= 0, got -0.1"),
        ({"batch_wait_timeout_s": float("inf")}, "batch_wait_timeout_s must be a number of seconds >= 0, got inf"),
        ({"batch_wait_timeout_s": "1"}, "batch_wait_timeout_s must be a number of seconds >= 0, got '1'"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^@batch: {message}$"):
        streamserve.batch(**kwargs)


def test_batch_must_decorate_a_function() -> None:
    with pytest.raises(ConfigError, match=r"options go by keyword: @batch\(max_batch_size=...\)"):
        streamserve.batch(32)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="decorates a function or method"):
        streamserve.batch(Model)


def test_zero_wait_is_allowed() -> None:
    assert batch_config_of(streamserve.batch(batch_wait_timeout_s=0)(double)) == BatchConfig(10, 0)


async def test_called_directly_a_list_in_and_a_list_out() -> None:
    assert double([1, 2, 3]) == [2, 4, 6]
    assert await adouble([1]) == [2]
    assert Model()([1, 2]) == [3, 6]
    assert await Model(2).predict([5]) == [10]
    assert double([]) == []


async def test_called_directly_a_wrong_output_raises_batch_output_error() -> None:
    @streamserve.batch
    def short(bodies: list[int]) -> list[int]:
        return bodies[1:]

    @streamserve.batch
    async def not_a_list(bodies: list[int]) -> dict[str, int]:
        return {"n": len(bodies)}

    with pytest.raises(BatchOutputError, match=r"short returned 1 outputs for 2 inputs"):
        short([1, 2])
    with pytest.raises(BatchOutputError, match=r"not_a_list must return a list with one output per input, got dict"):
        await not_a_list([1])
    assert streamserve.batch(lambda bodies: tuple(bodies))([1, 2]) == [1, 2]  # any sequence becomes a list


# -- the replica's Batcher, driven by hand ------------------------------------------------


class Recording:
    """A batch runner that records the batches it got and answers with each body doubled."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.fail = fail

    async def __call__(self, bodies: list[Any]) -> list[Any]:
        self.batches.append(bodies)
        if self.fail is not None:
            raise self.fail
        return [2 * b for b in bodies]


FAR = 10**15  # a deadline that never passes (epoch ms)


async def test_a_full_batch_runs_at_once_and_the_rest_waits_for_the_next() -> None:
    run = Recording()
    batcher = Batcher("f", BatchConfig(max_batch_size=3, batch_wait_timeout_s=60), run)
    futures = [batcher.submit(i, FAR) for i in range(4)]
    assert await asyncio.gather(*futures[:3]) == [0, 2, 4]
    assert run.batches == [[0, 1, 2]]
    assert not futures[3].done()  # one alone waits up to a minute for company...
    batcher.flush_now()  # ...unless the replica drains
    assert await futures[3] == 6
    assert run.batches == [[0, 1, 2], [3]]


async def test_a_batch_holding_all_of_max_ongoing_requests_runs_at_once() -> None:
    run = Recording()
    batcher = Batcher("f", BatchConfig(max_batch_size=8, batch_wait_timeout_s=60), run, slots=lambda: 2)
    assert await asyncio.gather(batcher.submit(1, FAR), batcher.submit(2, FAR)) == [2, 4]
    assert run.batches == [[1, 2]]  # the replica could not read a third: no reason to wait a minute


async def test_a_partial_batch_runs_when_the_wait_passes() -> None:
    run = Recording()
    batcher = Batcher("f", BatchConfig(max_batch_size=8, batch_wait_timeout_s=0.01), run)
    assert await asyncio.wait_for(asyncio.gather(batcher.submit(1, FAR), batcher.submit(2, FAR)), 10) == [2, 4]
    assert run.batches == [[1, 2]]


async def test_an_exception_fails_every_request_of_the_batch() -> None:
    batcher = Batcher("f", BatchConfig(max_batch_size=2, batch_wait_timeout_s=0), Recording(ValueError("bad")))
    results = await asyncio.gather(batcher.submit(1, FAR), batcher.submit(2, FAR), return_exceptions=True)
    assert [type(r) for r in results] == [ValueError, ValueError]


async def test_a_length_mismatch_fails_every_request_of_the_batch() -> None:
    async def short(bodies: list[Any]) -> list[Any]:
        return bodies[1:]

    batcher = Batcher("short", BatchConfig(max_batch_size=2, batch_wait_timeout_s=0), short)
    results = await asyncio.gather(batcher.submit(1, FAR), batcher.submit(2, FAR), return_exceptions=True)
    assert all(isinstance(r, BatchOutputError) for r in results)
    assert "short returned 1 outputs for 2 inputs" in str(results[0])


async def test_an_expired_request_does_not_join_the_batch() -> None:
    run = Recording()
    batcher = Batcher("f", BatchConfig(max_batch_size=3, batch_wait_timeout_s=0), run)
    stale = batcher.submit(1, now_ms() - 1)
    fresh = batcher.submit(2, FAR)
    with pytest.raises(DeadlinePassed):
        await stale
    assert await fresh == 4
    assert run.batches == [[2]]


async def test_aclose_cancels_what_still_waits() -> None:
    batcher = Batcher("f", BatchConfig(max_batch_size=8, batch_wait_timeout_s=60), Recording())
    waiting = batcher.submit(1, FAR)
    await batcher.aclose()
    assert waiting.cancelled()


async def test_a_replica_keeps_a_batcher_per_model_and_drops_idle_ones_past_a_bound() -> None:
    ran: list[tuple[str, list[int]]] = []
    release = asyncio.Event()

    async def run(handler: Any, bodies: list[int], model: str) -> list[int]:
        ran.append((model, bodies))
        if model == "kept":
            await release.wait()  # its batch runs on: not idle
        return bodies

    batchers = Batchers(run, lambda: 8, "test")
    handler = LoadedDeployment(adouble, is_class=False).handler("")
    running = asyncio.ensure_future(batchers.call("", handler, 1, FAR, model="kept"))
    for n in range(IDLE_BATCHERS_KEPT + 10):
        assert await batchers.call("", handler, n, FAR, model=f"m{n}") == n
    assert ("m0", [0]) in ran and all(len(bodies) == 1 for _model, bodies in ran)  # one model's requests a batch
    assert len(batchers._by_method) <= IDLE_BATCHERS_KEPT + 1
    assert ("", "kept") in batchers._by_method  # not idle: kept
    release.set()
    assert await running == 1
