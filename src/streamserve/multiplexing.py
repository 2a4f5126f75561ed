"""``@streamserve.multiplexed``: each replica keeps a few models loaded, the least recently used one unloaded to make
room (docs/multiplexing.md).

    class Adapters:
        @streamserve.multiplexed(max_models_per_replica=4)
        async def get_model(self, model_id: str): ...

        async def __call__(self, body):
            model = await self.get_model(streamserve.model_id())

The decorated loader is called once per model a replica loads: concurrent callers for a model being loaded wait for
that one load, and a load that raises fails each of them (the next call tries again). An async loader makes an async
``get_model``; a sync one a sync ``get_model`` (call it from a sync handler: it blocks its thread while it loads).

The replica is told what each cache does (ModelEvents): it holds the models' streams, so that requests for a model
go to a replica that has it loaded (wire/models.py), and counts loads and hits. To make room, a cache unloads the
least recently used of the models another replica holds too, when there are any (their requests go there, with no
load), else the least recently used one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any, Protocol, TypeVar, overload

from streamserve.runtime.request_scope import current_scope
from streamserve.wire.errors import BadRequestError, ConfigError
from streamserve.wire.models import MODEL_HEADER, check_model_id

logger = logging.getLogger(__name__)
# A loader, kept as it is typed by @multiplexed (a model id in, a model out).
L = TypeVar("L", bound=Callable[..., Any])

DEFAULT_MAX_MODELS = 3
# The attribute that marks a multiplexed loader (and holds its max_models_per_replica).
MARK = "__streamserve_multiplexed__"


class ModelEvents(Protocol):
    """What a replica is told of its models (workers/model_holder.py); called from any thread."""

    def loaded(self, model_id: str, seconds: float) -> None: ...

    def unloaded(self, model_id: str) -> None: ...

    def used(self, model_id: str, hit: bool) -> None: ...

    def failed(self, model_id: str) -> None: ...

    def shared(self) -> Collection[str]:
        """The models loaded here that another replica holds too (unloaded first)."""
        ...


_events: ModelEvents | None = None


def listen(events: ModelEvents | None) -> None:
    """The replica in this process is told of its caches' models from now on (None: nobody is)."""
    global _events
    _events = events


def model_id() -> str:
    """Inside a handler: the model id its request names (``X-Model-Id``, ``model_id=``), "" when it names none."""
    scope = current_scope()
    return scope.model if scope is not None else ""


def _checked(model_id: str | None) -> str:
    if not model_id:
        raise BadRequestError(f"no model id: the request must name one with the {MODEL_HEADER} header (model_id=)")
    return check_model_id(model_id)


async def _unload(model_id: str, model: Any) -> None:
    """Let go of an unloaded model: its ``aclose()`` or ``close()`` if it has one (then its ``__del__``, once the
    last reference goes)."""
    try:
        closer = getattr(model, "aclose", None) or getattr(model, "close", None)
        if callable(closer):
            result = closer()
            if inspect.isawaitable(result):
                await result
    except Exception:
        logger.exception("model %s: closing it failed", model_id)


def _unload_now(model_id: str, model: Any) -> None:
    """_unload from a thread (a sync loader's): an ``aclose()`` is run to its end on a loop of its own."""
    try:
        closer = getattr(model, "aclose", None) or getattr(model, "close", None)
        if callable(closer):
            result = closer()
            if inspect.iscoroutine(result):
                asyncio.run(result)
    except Exception:
        logger.exception("model %s: closing it failed", model_id)


# The cache whose loader the calling code runs in, if any (_Models._full).
_LOADING: contextvars.ContextVar[_Models | None] = contextvars.ContextVar("streamserve_loading", default=None)


class _Models:
    """The models one loader keeps for one owner (an instance, or a plain function): most recently used last."""

    def __init__(self, loader: Callable[..., Any], owner: Any, most: int) -> None:
        self._loader = loader
        self._owner = owner  # None for a plain function
        self._most = most
        self.models: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()  # a sync loader's callers come from several threads
        self._loading: dict[str, Any] = {}  # model id -> its load (a Task, or a concurrent Future)

    def _call_loader(self, model_id: str) -> Any:
        return self._loader(model_id) if self._owner is None else self._loader(self._owner, model_id)

    def _room_for_one(self) -> list[tuple[str, Any]]:
        """Models unloaded so that one more fits beside those loaded and those on their way (_full: not while those
        on their way fill every place)."""
        return self._unload_some(lambda: bool(self.models) and len(self.models) + len(self._loading) >= self._most)

    def _full(self) -> bool:
        """Whether loads on their way take every place: another waits for one of them (then unloads a model), so
        that no more than the most are ever kept or loading at once. Not for a load its own loader asks for (an
        adapter's loader that gets its base model from the same cache), which would wait on itself: it goes beside,
        one more for a while."""
        return len(self._loading) >= self._most and _LOADING.get() is not self

    def _unload_some(self, more: Callable[[], bool]) -> list[tuple[str, Any]]:
        """Models taken out while ``more()``: the least recently used of those another replica holds too first, then
        the least recently used."""
        shared = _shared()
        unloaded = []
        while more():
            gone = next((model_id for model_id in self.models if model_id in shared), None)
            unloaded.append(self.models.popitem(last=False) if gone is None else (gone, self.models.pop(gone)))
        for gone, _ in unloaded:
            _tell("unloaded", gone)
        return unloaded

    # -- an async loader ---------------------------------------------------------

    async def get(self, model_id: str) -> Any:
        if model_id in self.models:
            self.models.move_to_end(model_id)
            _tell("used", model_id, True)
            return self.models[model_id]
        _tell("used", model_id, False)
        while (load := self._loading.get(model_id)) is None and model_id not in self.models and self._full():
            await asyncio.wait(list(self._loading.values()), return_when=asyncio.FIRST_COMPLETED)
        if model_id in self.models:  # loaded by a caller whose load started while this one waited for room
            self.models.move_to_end(model_id)
            return self.models[model_id]
        if load is None:
            unloaded = self._room_for_one()
            # A task of its own: a caller cancelled while it loads stops waiting, not the load the others wait for.
            load = self._loading[model_id] = asyncio.ensure_future(self._load(model_id, unloaded))
            load.add_done_callback(_retrieved)  # its error is each waiter's (and nobody's if all stopped waiting)
        return await asyncio.shield(load)

    async def _load(self, model_id: str, unloaded: list[tuple[str, Any]]) -> Any:
        try:
            for gone, model in unloaded:
                await _unload(gone, model)
            del unloaded[:]  # the last references: __del__ runs now, before the new model takes the memory
            started = time.perf_counter()
            loading = _LOADING.set(self)  # (this load's own task: its context only)
            try:
                model = await self._call_loader(model_id)
            except BaseException:
                _tell("failed", model_id)
                raise
            finally:
                _LOADING.reset(loading)
            self.models[model_id] = model
            _tell("loaded", model_id, time.perf_counter() - started)
            return model
        finally:
            del self._loading[model_id]

    # -- a sync loader -------------------------------------------------------------

    def get_sync(self, model_id: str) -> Any:
        told = False
        while True:
            with self._lock:
                if model_id in self.models:
                    self.models.move_to_end(model_id)
                    if not told:
                        _tell("used", model_id, True)
                    return self.models[model_id]
                if not told:
                    _tell("used", model_id, False)
                    told = True
                waited: concurrent.futures.Future[Any] | None = self._loading.get(model_id)
                busy = list(self._loading.values()) if waited is None and self._full() else []
                if waited is None and not busy:
                    unloaded = self._room_for_one()
                    load: concurrent.futures.Future[Any] = concurrent.futures.Future()
                    self._loading[model_id] = load
                    break
            if waited is not None:
                return waited.result()
            concurrent.futures.wait(busy, return_when=concurrent.futures.FIRST_COMPLETED)  # then look again
        try:
            for gone, model in unloaded:
                _unload_now(gone, model)
            del unloaded[:]
            started = time.perf_counter()
            loading = _LOADING.set(self)
            try:
                model = self._call_loader(model_id)
            finally:
                _LOADING.reset(loading)
        except BaseException as exc:
            with self._lock:
                del self._loading[model_id]
            _tell("failed", model_id)
            load.set_exception(exc)
            raise
        with self._lock:
            self.models[model_id] = model
            del self._loading[model_id]
            _tell("loaded", model_id, time.perf_counter() - started)
        load.set_result(model)
        return model


def _retrieved(load: asyncio.Future[Any]) -> None:
    if not load.cancelled():
        load.exception()


def _shared() -> Collection[str]:
    events = _events
    return events.shared() if events is not None else ()


def _tell(what: str, *args: Any) -> None:
    events = _events
    if events is not None:
        getattr(events, what)(*args)


@overload
def multiplexed(loader: L, /) -> L: ...


@overload
def multiplexed(*, max_models_per_replica: int = DEFAULT_MAX_MODELS) -> Callable[[L], L]: ...


def multiplexed(loader: Callable[..., Any] | None = None, *, max_models_per_replica: int = DEFAULT_MAX_MODELS) -> Any:
    """Make ``loader(model_id)`` (a method, or a plain function) load each model once per replica, keeping at most
    ``max_models_per_replica`` loaded (the least recently used one is unloaded to make room). See the module's
    docstring; usable as ``@multiplexed`` and ``@multiplexed(max_models_per_replica=N)``."""
    if isinstance(max_models_per_replica, bool) or not isinstance(max_models_per_replica, int):
        raise ConfigError(f"max_models_per_replica must be a whole number, got {max_models_per_replica!r}")
    if max_models_per_replica < 1:
        raise ConfigError(f"max_models_per_replica must be at least 1, got {max_models_per_replica}")

    def wrap(fn: Callable[..., Any]) -> Any:
        return _wrap(fn, max_models_per_replica)

    return wrap(loader) if loader is not None else wrap


def _wrap(loader: Callable[..., Any], most: int) -> Any:
    params = list(inspect.signature(loader).parameters)
    is_method = bool(params) and params[0] == "self"
    kept_as = f"_streamserve_models_{loader.__name__}"
    made = threading.Lock()
    plain: list[_Models] = []  # a plain function's one cache

    def models_of(args: tuple[Any, ...]) -> tuple[_Models, str]:
        owner, given = (args[0], args[1:]) if is_method else (None, args)
        if len(given) != 1:
            raise TypeError(f"{loader.__qualname__}() takes one model id")
        model_id = _checked(given[0])
        if owner is None:
            with made:
                if not plain:
                    plain.append(_Models(loader, None, most))
            return plain[0], model_id
        kept = owner.__dict__.get(kept_as)
        if kept is None:
            with made:
                kept = owner.__dict__.setdefault(kept_as, _Models(loader, owner, most))
        return kept, model_id

    if inspect.iscoroutinefunction(loader):

        @functools.wraps(loader)
        async def get_async(*args: Any) -> Any:
            models, model_id = models_of(args)
            return await models.get(model_id)

        wrapper: Any = get_async
    else:

        @functools.wraps(loader)
        def get_sync(*args: Any) -> Any:
            models, model_id = models_of(args)
            return models.get_sync(model_id)

        wrapper = get_sync
    setattr(wrapper, MARK, most)
    return wrapper


def multiplexed_loaders(target: Any) -> dict[str, int]:
    """``target``'s multiplexed loaders: a class instance's methods, or for a function, the module-level loaders its
    body names (``load(model_id)`` beside it, or imported): name -> max_models_per_replica. Only those it names: a
    module's other functions, deployments of their own, do not multiplex for a loader beside them."""
    if inspect.isfunction(unwrapped := inspect.unwrap(target)):
        found = {name: unwrapped.__globals__.get(name) for name in _global_names(unwrapped.__code__)}
    else:
        found = {name: getattr(type(target), name, None) for name in dir(type(target))}
    return {name: getattr(fn, MARK) for name, fn in found.items() if hasattr(fn, MARK)}


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` uses, with those of the code nested in it (comprehensions, lambdas and inner
    functions are code objects of their own: a loader called from one was not seen)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
