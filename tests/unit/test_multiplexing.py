"""``@streamserve.multiplexed`` as a replica's handler code sees it: a cache of loaded models per instance, least
recently used out, one load per model however many callers wait for it, and the events the replica is told."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import streamserve
from streamserve import multiplexing
from streamserve.runtime.request_scope import RequestScope
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import BadRequestError, ConfigError
from streamserve.wire.idempotency import request_digest
from streamserve.wire.models import check_model_id, no_model_message
from streamserve.wire.response_cache import cache_digest


class Recorder:
    """The replica's side (ModelEvents), recording what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.held_elsewhere: set[str] = set()

    def loaded(self, model_id: str, seconds: float) -> None:
        self.events.append(("loaded", model_id))

    def unloaded(self, model_id: str) -> None:
        self.events.append(("unloaded", model_id))

    def used(self, model_id: str, hit: bool) -> None:
        self.events.append(("hit" if hit else "load", model_id))

    def failed(self, model_id: str) -> None:
        self.events.append(("failed", model_id))

    def shared(self) -> set[str]:
        return self.held_elsewhere


@pytest.fixture
def told() -> Iterator[Recorder]:
    recorder = Recorder()
    multiplexing.listen(recorder)
    yield recorder
    multiplexing.listen(None)


class Model:
    def __init__(self, model_id: str, closed: list[str]) -> None:
        self.model_id = model_id
        self._closed = closed

    async def aclose(self) -> None:
        self._closed.append(self.model_id)


class Loader:
    def __init__(self, load_s: float = 0.0, fail_first: bool = False) -> None:
        self.loads: list[str] = []
        self.closed: list[str] = []
        self.load_s = load_s
        self.fail_first = fail_first
        self.most_held = 0  # the most models loading or loaded (not closed yet) at once

    @streamserve.multiplexed(max_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        self.loads.append(model_id)
        self.most_held = max(self.most_held, len(self.loads) - len(self.closed))
        await asyncio.sleep(self.load_s)
        if self.fail_first and self.loads.count(model_id) == 1:
            raise RuntimeError(f"cannot load {model_id}")
        return Model(model_id, self.closed)


async def test_the_least_recently_used_model_is_closed_to_make_room(told: Recorder) -> None:
    loader = Loader()
    a = await loader.get_model("a")
    await loader.get_model("b")
    assert await loader.get_model("a") is a  # a hit
    await loader.get_model("c")  # b is the least recently used
    assert loader.loads == ["a", "b", "c"]
    assert loader.closed == ["b"]
    assert told.events == [
        ("load", "a"),
        ("loaded", "a"),
        ("load", "b"),
        ("loaded", "b"),
        ("hit", "a"),
        ("load", "c"),
        ("unloaded", "b"),
        ("loaded", "c"),
    ]


async def test_a_model_another_replica_holds_too_is_unloaded_first(told: Recorder) -> None:
    loader = Loader()
    await loader.get_model("a")
    await loader.get_model("b")
    told.held_elsewhere = {"b", "x"}  # b is the most recently used, but its requests can go to the other holder
    await loader.get_model("c")
    assert loader.closed == ["b"]
    told.held_elsewhere = set()
    await loader.get_model("d")  # none is: the least recently used goes
    assert loader.closed == ["b", "a"]


def test_a_sync_loader_unloads_a_model_another_replica_holds_too_first(told: Recorder) -> None:
    closed: list[str] = []

    class SyncLoader:
        @streamserve.multiplexed(max_models_per_replica=2)
        def get_model(self, model_id: str) -> Model:
            return Model(model_id, closed)

    loader = SyncLoader()
    loader.get_model("a")
    loader.get_model("b")
    told.held_elsewhere = {"b"}
    loader.get_model("c")
    assert ("unloaded", "b") in told.events and ("unloaded", "a") not in told.events


async def test_each_instance_keeps_its_own_models() -> None:
    first, second = Loader(), Loader()
    await first.get_model("a")
    await second.get_model("a")
    assert (first.loads, second.loads) == (["a"], ["a"])


async def test_concurrent_callers_wait_for_one_load_which_a_cancelled_caller_does_not_stop() -> None:
    loader = Loader(load_s=0.05)
    leaving = asyncio.ensure_future(loader.get_model("m"))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(loader.get_model("m")) for _ in range(5)]
    leaving.cancel()
    models = await asyncio.gather(*waiting)
    assert loader.loads == ["m"]
    assert len({id(model) for model in models}) == 1


async def test_a_failed_load_fails_every_waiter_and_the_next_call_loads_again(told: Recorder) -> None:
    loader = Loader(load_s=0.01, fail_first=True)
    results = await asyncio.gather(*(loader.get_model("m") for _ in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["cannot load m"] * 3
    assert loader.loads == ["m"]
    assert ("failed", "m") in told.events  # the replica holds it no more
    assert (await loader.get_model("m")).model_id == "m"
    assert loader.loads == ["m", "m"]


def test_a_sync_loader_loads_once_for_concurrent_threads_and_closes_what_it_unloads() -> None:
    loads: list[str] = []
    closed: list[str] = []
    started = threading.Event()

    class SyncModel:
        def __init__(self, model_id: str) -> None:
            self.model_id = model_id

        def close(self) -> None:
            closed.append(self.model_id)

    class SyncLoader:
        @streamserve.multiplexed(max_models_per_replica=1)
        def get_model(self, model_id: str) -> SyncModel:
            loads.append(model_id)
            started.set()
            threading.Event().wait(0.05)
            return SyncModel(model_id)

    loader = SyncLoader()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        models = list(pool.map(lambda _: loader.get_model("a"), range(8)))
    assert loads == ["a"]
    assert len({id(model) for model in models}) == 1
    loader.get_model("b")
    assert (loads, closed) == (["a", "b"], ["a"])


async def test_a_plain_function_can_be_a_loader() -> None:
    loads: list[str] = []

    @streamserve.multiplexed
    async def get_model(model_id: str) -> str:
        loads.append(model_id)
        return model_id.upper()

    assert [await get_model("a"), await get_model("a")] == ["A", "A"]
    assert loads == ["a"]


async def test_a_loader_called_without_a_model_id_names_the_header() -> None:
    with pytest.raises(BadRequestError, match="X-Model-Id"):
        await Loader().get_model(streamserve.model_id())  # outside a handler: ""
    with pytest.raises(BadRequestError, match="is not a model id"):
        await Loader().get_model("two words")


@pytest.mark.parametrize("model_id", ["a/../../b", "a/./b", "a//b", "org/"])
def test_a_model_id_has_no_path_steps(model_id: str) -> None:
    """A loader that joins the id onto a directory, as the docs' sketch does, would be sent out of it by a caller's
    X-Model-Id: a/../../b (found by an outside tester)."""
    with pytest.raises(BadRequestError, match=r"no part between slashes that is empty, \. or \.\."):
        check_model_id(model_id)
    assert check_model_id("org/lora:v2.1") == "org/lora:v2.1"


def test_model_id_is_the_requests_inside_a_handler() -> None:
    scope = RequestScope("r1", 0, model="org/lora:v2")
    assert scope.context().run(streamserve.model_id) == "org/lora:v2"
    assert streamserve.model_id() == ""


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4"])
def test_max_models_per_replica_must_be_a_positive_whole_number(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_models_per_replica"):
        streamserve.multiplexed(max_models_per_replica=bad)


def test_the_loader_marks_the_class_as_multiplexing() -> None:
    assert multiplexing.multiplexed_loaders(Loader()) == {"get_model": 2}
    assert multiplexing.multiplexed_loaders(object()) == {}


@streamserve.multiplexed(max_models_per_replica=4)
def load_plain(model_id: str) -> str:
    return model_id


def plain_handler(body: Any) -> Any:
    return load_plain(streamserve.model_id())


def handler_beside_it(body: Any) -> Any:
    return body


def handler_in_a_comprehension(body: Any) -> Any:
    return [load_plain(streamserve.model_id()) for _ in body]


def handler_in_a_lambda(body: Any) -> Any:
    return (lambda: load_plain(streamserve.model_id()))()


def test_a_function_handler_multiplexes_with_the_module_level_loader_it_calls() -> None:
    """Not a function beside the loader that does not call it: a deployment of its own needs no model id. Called
    from a comprehension or a lambda, code objects of their own, the loader was not seen."""
    assert multiplexing.multiplexed_loaders(plain_handler) == {"load_plain": 4}
    assert multiplexing.multiplexed_loaders(handler_beside_it) == {}
    assert multiplexing.multiplexed_loaders(handler_in_a_comprehension) == {"load_plain": 4}
    assert multiplexing.multiplexed_loaders(handler_in_a_lambda) == {"load_plain": 4}


async def test_loads_side_by_side_never_hold_more_models_than_the_most_kept(told: Recorder) -> None:
    """A load waits for room while those on their way fill every place: at no moment are more models loading or
    loaded (not yet closed) than max_models_per_replica."""
    loader = Loader(load_s=0.02)
    models = await asyncio.gather(*(loader.get_model(m) for m in "abcdeab"))  # two places
    assert [model.model_id for model in models] == list("abcdeab")
    assert loader.most_held <= 2, (loader.loads, loader.closed)
    held = {e[1] for e in told.events if e[0] == "loaded"} - {e[1] for e in told.events if e[0] == "unloaded"}
    assert len(held) <= 2


def test_sync_loads_side_by_side_never_hold_more_models_than_the_most_kept() -> None:
    live: set[str] = set()
    most = [0]
    lock = threading.Lock()

    class SyncModel:
        def __init__(self, model_id: str) -> None:
            self.model_id = model_id

        def close(self) -> None:
            with lock:
                live.discard(self.model_id)

    class SyncLoader:
        @streamserve.multiplexed(max_models_per_replica=2)
        def get_model(self, model_id: str) -> SyncModel:
            with lock:
                live.add(model_id)
                most[0] = max(most[0], len(live))
            threading.Event().wait(0.02)
            return SyncModel(model_id)

    loader = SyncLoader()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        models = list(pool.map(lambda m: loader.get_model(m).model_id, "abcdefab"))
    assert models == list("abcdefab")
    assert most[0] <= 2, most


def test_one_body_for_two_models_is_two_requests_to_keys_and_the_cache() -> None:
    cfg = DeploymentConfig(name="adapters", import_path="x:y")
    assert request_digest("", b'{"a":1}', "m1") != request_digest("", b'{"a":1}', "m2")
    assert request_digest("", b'{"a":1}', "") == request_digest("", b'{"a": 1}')  # without a model: as before
    assert cache_digest(cfg, "", b"1", "m1") != cache_digest(cfg, "", b"1", "m2") != cache_digest(cfg, "", b"1")


def test_a_request_without_a_model_id_is_told_how_each_caller_names_one() -> None:
    message = no_model_message("forecast")
    assert "'forecast' serves many models" in message
    assert all(way in message for way in ("X-Model-Id header", "model_id=", "--model-id"))


async def test_a_loader_that_gets_from_its_own_cache_does_not_wait_on_itself() -> None:
    """An adapter's loader that loads its base model through the same cache, with one place: the base's load goes
    beside the adapter's (it would wait for the adapter's load, which waits for it)."""

    class Adapters:
        def __init__(self) -> None:
            self.loads: list[str] = []

        @streamserve.multiplexed(max_models_per_replica=1)
        async def get_model(self, model_id: str) -> str:
            self.loads.append(model_id)
            if model_id.startswith("adapter-"):
                base = await self.get_model("base")
                return f"{model_id} on {base}"
            return model_id

    adapters = Adapters()
    assert await asyncio.wait_for(adapters.get_model("adapter-a"), 5) == "adapter-a on base"
    assert adapters.loads == ["adapter-a", "base"]


def test_a_sync_loader_that_gets_from_its_own_cache_does_not_wait_on_itself() -> None:
    class Adapters:
        @streamserve.multiplexed(max_models_per_replica=1)
        def get_model(self, model_id: str) -> str:
            if model_id.startswith("adapter-"):
                return f"{model_id} on {self.get_model('base')}"
            return model_id

    got: list[str] = []
    loading = threading.Thread(target=lambda: got.append(Adapters().get_model("adapter-a")), daemon=True)
    loading.start()
    loading.join(5)  # (a daemon thread: should it wait on itself, the test fails, and ends)
    assert got == ["adapter-a on base"]
