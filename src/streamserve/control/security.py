"""What keeps strangers from running code: the import allow-list, and no open admin API off loopback.

Whoever can deploy chooses an ``import_path``, and importing it runs code.
So admin writes must not be open to whoever reaches the gateway, and
``STREAMSERVE_IMPORT_ALLOW`` can confine deployments to the user's own
modules, checked where configs are written and again where replicas import.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from streamserve.wire.errors import ConfigError

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class ImportAllowList:
    """Module prefixes deployments may import from; empty means any module."""

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

    def allows(self, import_path: str) -> bool:
        module = import_path.partition(":")[0]
        return not self.prefixes or any(module == p or module.startswith(p + ".") for p in self.prefixes)

    def check(self, import_path: str, deployment: str) -> None:
        """ConfigError unless ``import_path``'s module is under one of the prefixes."""
        if not self.allows(import_path):
            raise ConfigError(
                f"deployment {deployment!r}: import_path {import_path!r} is outside STREAMSERVE_IMPORT_ALLOW "
                f"({', '.join(self.prefixes)})"
            )


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
