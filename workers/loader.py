"""Import a deployment's ``module:attr`` and turn it into something a replica can call."""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamserve.batching import BatchConfig, batch_config_of
from streamserve.control.security import ImportAllowList
from streamserve.multiplexing import multiplexed_loaders
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import BadRequestError, ConfigError

# Methods of a deployment's class that the replica calls itself (on a config change, for its health check): no request
# may name them, or a caller could set one replica's user_config apart from the others'.
RECONFIGURE = "reconfigure"
CHECK_HEALTH = "check_health"
LIFECYCLE_HOOKS = frozenset({RECONFIGURE, CHECK_HEALTH})


@dataclass
class Handler:
    """One callable of the deployment, whether it must be awaited, whether it takes batches, whether it streams."""

    fn: Callable[..., Any]
    # Runs on the event loop: a coroutine function, or an async generator function (a streaming one).
    is_async: bool
    # Set for a ``@streamserve.batch`` handler: it takes a list of bodies (workers/batcher.py).
    batch: BatchConfig | None = None
    # A generator or async generator function: each value it yields is one chunk (workers/streaming.py).
    is_stream: bool = False


@dataclass
class LoadedDeployment:
    """The user's function, or the single instance of the user's class."""

    target: Any
    is_class: bool
    _handlers: dict[str, Handler] = field(default_factory=dict)

    def handler(self, method: str) -> Handler:
        """The callable for a request's ``method`` ("" means the function itself or ``__call__``)."""
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        if not method:
            fn = self.target
            if self.is_class and not callable(fn):
                raise BadRequestError(
                    f"{type(fn).__name__} has no __call__: only a call that names one of its methods reaches it "
                    "(method= from Python; an HTTP request names none)"
                )
        elif not self.is_class:
            raise BadRequestError(f"method {method!r} given, but the deployment is a function")
        elif method in LIFECYCLE_HOOKS:
            raise BadRequestError(
                f"{type(self.target).__name__}.{method} is called by the replica itself, not by requests"
            )
        elif method.startswith("_") or not callable(getattr(self.target, method, None)):
            raise BadRequestError(f"{type(self.target).__name__} has no public method {method!r}")
        else:
            fn = getattr(self.target, method)
        stream = is_stream(fn)
        handler = Handler(fn, _is_async(fn) or (stream and _is_async_generator(fn)), batch_config_of(fn), stream)
        self._handlers[method] = handler
        return handler

    @property
    def check_health(self) -> Handler | None:
        """The instance's ``check_health()``, sync or async, if it has one (workers/health_checks.py calls it)."""
        fn = getattr(self.target, CHECK_HEALTH, None) if self.is_class else None
        return Handler(fn, _is_async(fn)) if callable(fn) else None

    @functools.cached_property
    def max_models(self) -> int:
        """How many models the ``@streamserve.multiplexed`` loaders of the instance (or those the function names)
        keep together (0: none, so requests need not name a model)."""
        return sum(multiplexed_loaders(self.target).values())

    @property
    def multiplexed(self) -> bool:
        """Whether the deployment has a multiplexed loader: then every request must name its model."""
        return self.max_models > 0

    @property
    def reconfigure(self) -> Callable[[Any], Any] | None:
        """The instance's ``reconfigure(user_config)``, if it has one."""
        fn = getattr(self.target, RECONFIGURE, None) if self.is_class else None
        return fn if callable(fn) else None


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an instance whose __call__ is async
    return call is not None and inspect.iscoroutinefunction(call)


def _is_generator_function(fn: object) -> bool:
    # inspect sees through bound methods and functools.partial.
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def _called(fn: Callable[..., Any]) -> object:
    """What runs when ``fn`` is called: itself, or an instance's ``__call__``."""
    if inspect.isroutine(fn) or isinstance(fn, functools.partial):
        return fn
    return getattr(fn, "__call__", None)  # noqa: B004 - a callable instance


def is_stream(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a generator or an async generator: a function, a bound method, or an instance
    whose ``__call__`` is one."""
    return _is_generator_function(_called(fn))


def _is_async_generator(fn: Callable[..., Any]) -> bool:
    return inspect.isasyncgenfunction(_called(fn))


def _refuse_batched_generators(obj: Any, import_path: str) -> None:
    """ConfigError for a ``@streamserve.batch`` handler that is a generator (``obj``: the function, or the class
    before it is built): a batch has one result per body, and streams are not batched."""
    if inspect.isclass(obj):
        names = [name for name in dir(obj) if name == "__call__" or not name.startswith("_")]
        candidates = [(f"{obj.__name__}.{name}", inspect.getattr_static(obj, name, None)) for name in names]
    else:
        candidates = [(import_path, obj)]
    for name, found in candidates:
        fn = getattr(found, "__func__", found)  # staticmethod, classmethod
        if batch_config_of(fn) is None:
            continue
        call = _called(fn)
        if callable(call) and _is_generator_function(inspect.unwrap(call)):  # under @batch's own wrapper
            raise ConfigError(
                f"{name} is a @streamserve.batch generator: a batched handler cannot stream (a batch returns one "
                "result per body); drop @streamserve.batch, or return a list instead of yielding"
            )


def _refuse_cached_streams(obj: Any, cfg: DeploymentConfig) -> None:
    """ConfigError for a deployment with ``response_cache`` whose handler (or a public method) streams: a stream's
    chunks are not kept, and identical streams cannot share one run."""
    if cfg.response_cache is None:
        return
    if inspect.isclass(obj):
        names = [name for name in dir(obj) if name == "__call__" or not name.startswith("_")]
        candidates = [(f"{obj.__name__}.{name}", inspect.getattr_static(obj, name, None)) for name in names]
    else:
        candidates = [(cfg.import_path, obj)]
    for name, found in candidates:
        call = _called(getattr(found, "__func__", found))
        if callable(call) and _is_generator_function(inspect.unwrap(call)):
            raise ConfigError(
                f"response_cache: {name} is a generator, and streaming deployments are not cached; drop "
                "response_cache from the deployment"
            )


def import_attr(import_path: str, allow: ImportAllowList, deployment: str) -> Any:
    """``package.module:attr.sub`` -> the object; ConfigError says what failed.

    ``allow`` judges the module named, then every object reached on the way, each before the next attribute is
    read from it (the rule is ImportAllowList's): ``examples.echo:os.system`` stops at ``os``.
    """
    allow.check(import_path, deployment)
    module_name, _, attr_path = import_path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        where = ""
        if (
            isinstance(exc, ModuleNotFoundError)
            and exc.name is not None
            and (module_name == exc.name or module_name.startswith(exc.name + "."))
        ):
            # The module itself, not one it imports: the farm may run from a directory that does not hold it.
            where = f" (looked for from {os.getcwd()}, where this replica runs, and the installed packages)"
        raise ConfigError(f"cannot import module {module_name!r}: {exc}{where}") from exc
    allow.check_reached(obj, module_name, import_path, deployment)
    parts = attr_path.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            close = difflib.get_close_matches(part, [name for name in dir(obj) if not name.startswith("_")], n=1)
            hint = f" (did you mean {'.'.join([*parts[:i], close[0]])!r}?)" if close else ""
            raise ConfigError(f"module {module_name!r} has no attribute {attr_path!r}{hint}") from None
        allow.check_reached(obj, f"{module_name}:{'.'.join(parts[: i + 1])}", import_path, deployment)
    return obj


def load(cfg: DeploymentConfig, allow: ImportAllowList) -> LoadedDeployment:
    """Import the deployment (as far as ``allow`` lets it) and, for a class, build its one instance (constructor
    errors propagate)."""
    obj = import_attr(cfg.import_path, allow, cfg.name)
    if callable(obj):
        _refuse_batched_generators(obj, cfg.import_path)  # before a constructor that may take minutes
        _refuse_cached_streams(obj, cfg)
    if inspect.isclass(obj):
        return LoadedDeployment(obj(*cfg.init_args, **cfg.init_kwargs), is_class=True)
    if not callable(obj):
        raise ConfigError(f"{cfg.import_path} is not a function or class: its type is {type(obj).__name__}")
    if cfg.init_args or cfg.init_kwargs:
        raise ConfigError(f"{cfg.import_path} is a function: init_args and init_kwargs only apply to a class")
    _refuse_bodyless(obj, cfg.import_path)
    return LoadedDeployment(obj, is_class=False)


def _refuse_bodyless(fn: Callable[..., Any], import_path: str) -> None:
    """ConfigError for a function that cannot be called with a request's body (``def f():``): it loaded, and every
    call failed with a TypeError (500)."""
    try:
        inspect.signature(fn, follow_wrapped=False).bind(None)  # (as it is called: a decorator's wrapper)
    except ValueError:
        return  # no signature to read (a builtin): its calls will tell
    except TypeError as exc:
        raise ConfigError(f"{import_path} cannot take a request's body as its one argument ({exc})") from None
