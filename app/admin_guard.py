"""Who may send an admin write: the checks before ``/-/deploy`` and the other writes run.

Deploying imports code, so an admin write is code execution. The guard
follows what notebook servers learned: a token always, never ambient
authority from being on the same machine. A web page the developer opens
can send requests to ``127.0.0.1`` (and, by DNS rebinding, under its own
host name), so these are refused as well, before the token is compared:

- a ``Host`` other than the bound address, ``localhost``, a loopback address
  or a name in ``STREAMSERVE_ALLOWED_HOSTS`` (a wildcard bind also takes IP
  literals and this machine's names: a rebinding page cannot send those);
- a browser ``Origin`` other than the gateway's own or one in
  ``STREAMSERVE_ALLOWED_ORIGINS``;
- a body that is not ``application/json`` (what a cross-site form or a
  ``text/plain`` fetch can send without asking first).

The host judged is the one an absolute-form target names (``POST
http://host/...``), else the Host header's (RFC 9112, 3.2.2); a second
Host, Origin or Content-Type is refused, not decided by order (a proxy
may go by the other one).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable

from fastapi import Request
from starlette.datastructures import Headers

from streamserve.app.bodies import check_content_coding
from streamserve.app.http_protocol import TARGET_HOST
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import BadRequestError, ForbiddenError, UnauthorizedError, UnsupportedMediaTypeError

ANY = "*"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# The headers the guard decides by, which an admin write may carry once each.
ONE_EACH = ("Host", "Origin", "Content-Type", "Authorization", "X-API-Key")
TOKEN_HINT = (
    "admin writes need 'Authorization: Bearer <token>': the token is STREAMSERVE_API_KEY, or the file api_key in "
    "the data directory of `streamserve up` (.streamserve/api_key by default)"
)


def _names(raw: str | None) -> frozenset[str]:
    """``"a.example, B.example."`` -> {"a.example", "b.example"}."""
    return frozenset(item.strip().lower().rstrip(".") for item in (raw or "").split(",") if item.strip())


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower case, without its port or brackets: ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        header = header.partition(":")[0]
    return header.rstrip(".")


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _machine_names() -> Iterable[str]:
    yield socket.gethostname().lower()
    yield socket.getfqdn().lower()


class AdminGuard:
    """The FastAPI dependency of every admin write; raises the error that says what is missing."""

    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.admin
        self.token = None if settings.api_key is None else settings.api_key.get_secret_value().encode()
        bound = (settings.bind_host or "127.0.0.1").strip("[]").lower()
        self.wildcard_bind = bound in WILDCARD_BINDS
        hosts = _names(settings.allowed_hosts)
        self.any_host = ANY in hosts
        self.hosts = LOOPBACK_NAMES | hosts | {bound} | (frozenset(_machine_names()) if self.wildcard_bind else set())
        origins = _names(settings.allowed_origins)
        self.any_origin = ANY in origins
        self.origins = origins

    def __call__(self, request: Request) -> None:
        if not self.enabled:
            raise ForbiddenError(
                "admin writes are switched off on this gateway (STREAMSERVE_ADMIN=off); "
                "deploy with the streamserve CLI or the Python client"
            )
        if self.token is None:
            raise ForbiddenError(
                "admin writes need a token and this gateway has none: set STREAMSERVE_API_KEY for it "
                "(`streamserve up` makes one), or deploy with the streamserve CLI or the Python client"
            )
        self.check_site(request)
        headers = request.headers
        if "x-api-key" in headers and "authorization" in headers:  # (which one counts would be a guess)
            raise BadRequestError("an admin write takes its token once: in Authorization or in X-API-Key, not both")
        if not self.holds_token(headers):
            raise UnauthorizedError(TOKEN_HINT)
        self.check_media_type(request.method, headers)

    def holds_token(self, headers: Headers) -> bool:
        """Whether the request carries the admin token (``Authorization: Bearer`` or ``X-API-Key``)."""
        if self.token is None:
            return False
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        given = headers.get("x-api-key") or (credentials.strip() if scheme.lower() == "bearer" else "")
        return hmac.compare_digest(given.encode(), self.token)

    def check_site(self, request: Request) -> None:
        """ForbiddenError for a write sent by way of another site: its host (check_host) or Origin (check_origin);
        BadRequestError for two of a header the guard decides by."""
        for header in ONE_EACH:
            if (copies := len(request.headers.getlist(header))) > 1:
                raise BadRequestError(f"an admin write takes one {header} header, got {copies}")
        target: str | None = request.scope.get(TARGET_HOST)
        host = target if target is not None else request.headers.get("host", "")
        self.check_host(host, "the request target's host" if target is not None else "Host")
        self.check_origin(request.headers.get("origin"), f"{request.url.scheme}://{host.strip().lower()}")

    def check_host(self, header: str, named: str = "Host") -> None:
        """ForbiddenError for a host this gateway is not known by (DNS rebinding sends the attacker's name);
        ``named``: where it came from, for the message."""
        name = host_name(header)
        if self.any_host or name in self.hosts or (self.wildcard_bind and _is_ip_literal(name)):
            return
        raise ForbiddenError(
            f"admin writes are not taken for {named} {header!r}: use the gateway's address or localhost, "
            "or add the name to STREAMSERVE_ALLOWED_HOSTS"
        )

    def check_origin(self, origin: str | None, own_origin: str) -> None:
        """ForbiddenError for a browser request from another site; requests without Origin (curl, CLIs) pass."""
        if origin is None:
            return
        given = origin.strip().lower().rstrip("/")
        if given == own_origin or self.any_origin or given in self.origins:
            return
        raise ForbiddenError(
            f"admin writes are not taken from the web page at Origin {origin!r}; "
            "allow it with STREAMSERVE_ALLOWED_ORIGINS if it is yours"
        )

    @staticmethod
    def check_media_type(method: str, headers: Headers) -> None:
        """UnsupportedMediaTypeError unless a body comes as ``application/json``, unencoded (a DELETE has none)."""
        has_body = method in BODY_METHODS or headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if has_body and media_type != "application/json":
            raise UnsupportedMediaTypeError(
                f"admin writes take a JSON body with 'Content-Type: application/json', not {media_type or 'none'!r}"
            )
        if has_body:
            check_content_coding(headers.getlist("content-encoding"))
