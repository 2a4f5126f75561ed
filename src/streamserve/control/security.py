"""What keeps strangers from running code: the import allow-list, and no open admin API off loopback.

Whoever can deploy chooses an ``import_path``, and importing it runs code.
So admin writes must not be open to whoever reaches the gateway, and
``STREAMSERVE_IMPORT_ALLOW`` can confine deployments to the user's own
modules, checked where configs are written and again where replicas import.
"""

from __future__ import annotations

import inspect
import ipaddress
import re
import types
from dataclasses import dataclass

from streamserve.wire.errors import ConfigError

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


# Never allowed, even when listed: every module can reach it (``__builtins__``), and it holds eval, exec and open.
BUILTINS = "builtins"


@dataclass(frozen=True)
class ImportAllowList:
    """Module prefixes deployments may import from; empty means any module.

    The rule: an import path ``module:attr.path`` is allowed when ``module`` is under an allowed prefix (the
    prefix itself or a submodule of it), and every object reached along the attribute path (the module object
    itself, each intermediate object and the final one) comes from a module under an allowed prefix. Where an
    object comes from: for a module object, its ``__name__``; for a class, a function or a method, its
    ``__module__``; for any other object (an instance), its class's ``__module__``, so an instance is allowed
    when its type is defined in an allowed module. Builtins are refused: an object whose module is ``builtins``
    (even if listed), or that names no module (``__module__`` missing or None, as for the methods of built-in
    types), is never allowed. Each object is checked before the next attribute is read from it. With no
    allow-list (``STREAMSERVE_IMPORT_ALLOW`` unset or empty), every import path is allowed.

    The first half (``check``) needs only the string and runs where configs are written; the second
    (``check_reached``) needs the objects and runs where a replica imports them (workers/loader.py).
    """

    prefixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str | None) -> ImportAllowList:
        """``"examples, myapp.models"`` -> the prefixes; ValueError names an item that is not a module name."""
        if raw is None or not raw.strip():
            return cls()
        prefixes = tuple(item.strip() for item in raw.split(","))
        for prefix in prefixes:
            if not _MODULE.match(prefix):
                raise ValueError(f"{prefix!r} is not a module name (expected e.g. 'examples,myapp.models')")
        return cls(prefixes)

    def covers(self, module: str | None) -> bool:
        """Whether ``module`` is under one of the prefixes (always, when there are none; never for builtins)."""
        if not self.prefixes:
            return True
        if module is None or module == BUILTINS:
            return False
        return any(module == p or module.startswith(p + ".") for p in self.prefixes)

    def allows(self, import_path: str) -> bool:
        return self.covers(import_path.partition(":")[0])

    def check(self, import_path: str, deployment: str) -> None:
        """ConfigError unless ``import_path``'s module is under one of the prefixes."""
        if not self.allows(import_path):
            raise ConfigError(
                f"deployment {deployment!r}: import_path {import_path!r} is outside STREAMSERVE_IMPORT_ALLOW "
                f"({', '.join(self.prefixes)})"
            )

    def check_reached(self, obj: object, reached: str, import_path: str, deployment: str) -> None:
        """ConfigError unless ``obj``, reached as ``reached`` along ``import_path``, comes from an allowed module."""
        if not self.prefixes:
            return
        module = origin_of(obj)
        if self.covers(module):
            return
        where = f"module {module!r}" if module is not None else "no module (a builtin)"
        raise ConfigError(
            f"deployment {deployment!r}: import_path {import_path!r} is refused: {reached!r} is "
            f"{_kind_of(obj)} from {where}, outside STREAMSERVE_IMPORT_ALLOW ({', '.join(self.prefixes)}); "
            "name a function or class defined in an allowed module"
        )


def origin_of(obj: object) -> str | None:
    """The module ``obj`` comes from, as ImportAllowList judges it; None when it names none."""
    if isinstance(obj, types.ModuleType):
        module: object = obj.__name__
    elif isinstance(obj, type) or inspect.isroutine(obj):
        module = getattr(obj, "__module__", None)
    else:
        module = type(obj).__module__
    return module if isinstance(module, str) else None


def _kind_of(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return f"the module {obj.__name__!r}"
    if isinstance(obj, type):
        return f"the class {obj.__qualname__!r}"
    if inspect.isroutine(obj):
        return f"the function {getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))!r}"
    return f"an instance of {type(obj).__qualname__!r}"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name we do not resolve here: assume it is reachable from outside


def check_exposure(host: str, *, api_key_set: bool, admin: bool) -> None:
    """Refuse to serve admin writes (which can deploy code) beyond loopback without an API key."""
    if admin and not api_key_set and not is_loopback(host):
        raise ConfigError(
            f"refusing to bind {host} with the admin API open: anyone who reaches it could deploy code. "
            "Set STREAMSERVE_API_KEY to a secret (admin writes then need 'Authorization: Bearer <key>'), "
            "or switch admin writes off with --no-admin (STREAMSERVE_ADMIN=off) and deploy with the CLI "
            "or the Python client, which write to Redis directly"
        )
