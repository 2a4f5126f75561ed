"""Process settings, declared once; read from the environment at an entry point and passed down."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamserve.control.resources import GPU_LIST_RE
from streamserve.control.security import ImportAllowList
from streamserve.transport.cluster_nodes import CLUSTER_NODES_ENV, give_nodes, parse_nodes
from streamserve.transport.connections import redacted, url_option_problem
from streamserve.wire.errors import BadRequestError, ConfigError
from streamserve.wire.keys import DEFAULT_PREFIX, Keys
from streamserve.wire.limits import ConfigLimits
from streamserve.wire.tenants import TenantKeys

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
API_KEY_ENV = "STREAMSERVE_API_KEY"
TENANT_KEYS_ENV = "STREAMSERVE_TENANT_KEYS"
# What only a gateway needs, and user code must not be able to read.
GATEWAY_SECRETS_ENV = (API_KEY_ENV, TENANT_KEYS_ENV)


REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")
# What a URL's user:password part may not hold as it is (each but '@' ends the host part early), and how it is written.
PERCENT_ENCODED = {"?": "%3F", "#": "%23", "/": "%2F", "@": "%40"}


def redis_url_problem(url: str) -> str | None:
    """Why redis-py cannot take ``url`` apart as it was meant, None when it can; never a word of the URL itself.

    A password's unencoded ``?``, ``#`` or ``/`` ends the host part early, so redis-py read the rest of the password
    as the port (a ValueError, and a 41-line traceback) or, when that was a number, connected elsewhere without it.
    urllib's own messages quote the would-be port, a piece of the password: they are not passed on. A URL of another
    scheme (an http:// one, a bare host:port) redis-py would refuse only once a first command connects; a blank one
    names no Redis (the default).
    """
    if not url.strip():
        return None
    if not url.strip().lower().startswith(REDIS_URL_SCHEMES):
        return f"{redacted(url)!r} is not a Redis URL: it starts with redis://, rediss:// or unix://"
    try:
        parts = urlsplit(url)
    except ValueError:  # (urllib's only refusal here: a "[" host that is no IPv6 address)
        return _unparsable("its host in [ ] is not an IPv6 address")
    try:
        _ = parts.port
    except ValueError:
        return _unparsable("its port is not a number from 0 to 65535")
    if parts.fragment:
        return _unparsable("it holds a '#', which ends a URL")
    # A password cut short by its ? or / leaves its '@' in the path, in a query parameter's name, or behind no host;
    # an '@' in a query's value (a CA file's path: ssl_ca_certs=/home/me@corp/ca.pem) is fine.
    after_host = url.partition("://")[2][len(parts.netloc) :]
    if parts.scheme.lower() != "unix" and "@" in after_host:
        names = [pair.partition("=")[0] for pair in parts.query.split("&")]
        if "@" in parts.path or any("@" in name for name in names) or not parts.hostname:
            return _unparsable("it holds an '@' after its host")
    if (problem := url_option_problem(url)) is not None:
        return f"{redacted(url)!r}: {problem}"
    return None


def _unparsable(problem: str) -> str:
    encoded = ", ".join(f"{char} as {code}" for char, code in PERCENT_ENCODED.items())
    return f"cannot be parsed: {problem}; a password with ?, #, / or @ in it must be percent-encoded ({encoded})"


def _setting_name(loc: tuple[int | str, ...]) -> str:
    """How the user names the setting at ``loc``: its environment variable (the URL also by its option)."""
    name = "_".join(map(str, loc)).upper().removeprefix("STREAMSERVE_")  # (a field's name, or the alias it came by)
    return "--redis-url / REDIS_URL" if name == "REDIS_URL" else f"STREAMSERVE_{name}"


def add_redis_url_option(parser: argparse.ArgumentParser, role: bool = False) -> None:
    """The ``--redis-url`` option every streamserve command takes; read it with Settings.from_command_line.
    ``role``: for a role's process (gateway, scheduler, worker, job-worker), which has no --data-dir to look in."""
    if role:
        default = f"$STREAMSERVE_REDIS_URL, else $REDIS_URL, else {DEFAULT_REDIS_URL}"
    else:
        default = (
            "$STREAMSERVE_REDIS_URL, else $REDIS_URL; else `up` embeds one, and the other commands use the Redis of "
            f"the `up` that runs from --data-dir, else {DEFAULT_REDIS_URL}"
        )
    parser.add_argument("--redis-url", help=f"the farm's Redis (default: {default})")


def add_no_admin_option(parser: argparse.ArgumentParser) -> None:
    """``--no-admin``: the gateway takes no admin writes (Settings.from_command_line reads it)."""
    parser.add_argument(
        "--no-admin",
        action="store_true",
        help="switch the gateway's admin writes off (STREAMSERVE_ADMIN=off); the CLI and clients still deploy",
    )


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (anything else is a usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1-65535 (0, "any free port", is not one a banner or a client could name)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {value}")
    return value


def checked_argument(check: Callable[[str], str]) -> Callable[[str], str]:
    """argparse type of a check a client or a config makes (check_tenant, check_model_id, check_name): its refusal
    (BadRequestError, ValueError) is a usage error."""

    def checked(given: str) -> str:
        try:
            return check(given)
        except (BadRequestError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return checked


def add_gateway_workers_option(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--workers N`` (gateway) or ``--gateway-workers N`` (up): gateway processes sharing the one port."""
    parser.add_argument(
        flag,
        dest="gateway_workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="gateway processes on the one port (default 1); each has its own Redis connections and reply stream",
    )


def api_key_problem(key: str) -> str:
    """Why ``key`` cannot be the admin token ("" when it can): a header must carry it as it is (set with a trailing
    space or a non-ASCII letter, the gateway started and no token was ever taken: a header's value is stripped, and
    its bytes read as Latin-1)."""
    if not key.strip():
        return "set but blank; set a secret, or unset it for no key"
    if key != key.strip():
        return "starts or ends with whitespace, which no HTTP header carries: remove it"
    if not (key.isascii() and key.isprintable()):
        return (
            "has characters an HTTP header does not carry as they are (beyond printable ASCII): "
            "use letters, digits and punctuation"
        )
    return ""


class Settings(BaseSettings):
    """Everything a streamserve process may be configured with.

    Each field reads ``STREAMSERVE_<FIELD>`` from the environment; the Redis
    URL also reads plain ``REDIS_URL``. Child processes get the same values
    through ``to_env()``.
    """

    # hide_input_in_errors: a ValidationError of Settings() (a client's, a library user's) quotes no URL or key.
    model_config = SettingsConfigDict(
        env_prefix="STREAMSERVE_", frozen=True, extra="forbid", populate_by_name=True, hide_input_in_errors=True
    )

    # redis://, rediss:// (TLS) or unix:// URL, with password if any; None: the default local one.
    redis_url: str | None = Field(None, validation_alias=AliasChoices("STREAMSERVE_REDIS_URL", "REDIS_URL"))

    # More nodes of the Redis Cluster the URL names, "host:port,..." (transport/cluster_nodes.py): tried when the URL's
    # is down. `up` and the scheduler set it on the processes they start, with the nodes they know.
    redis_cluster_nodes: str | None = Field(None, validation_alias=AliasChoices(CLUSTER_NODES_ENV))

    # The Redis password, kept out of the URL (e.g. from a Kubernetes Secret); a password in the URL wins.
    redis_password: SecretStr | None = None

    # Every Redis key starts with this and a colon.
    key_prefix: str = Field(DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9_.-]+$")

    # When set, admin writes on the gateway need ``Authorization: Bearer <key>``; empty or blank is an error.
    api_key: SecretStr | None = None

    # A file of "KEY TENANT" lines: when set, every deployment request to the gateway needs
    # "Authorization: Bearer KEY" with one of its keys, which decides the request's tenant (docs/tenants.md).
    tenant_keys: str | None = None

    # Whether the gateway takes admin writes (deploy, scale, delete, traffic) at all.
    admin: bool = True

    # Comma-separated module prefixes deployments may import from (e.g. "examples,myapp"); unset: any module.
    import_allow: str | None = None

    # Comma-separated host names (besides the bound address and localhost) under which the gateway takes admin
    # writes, e.g. "gateway.internal,serve.example.com"; "*" takes any (app/admin_guard.py).
    allowed_hosts: str | None = None

    # Comma-separated browser origins that may send admin writes, e.g. "https://ops.example.com"; "*" any.
    allowed_origins: str | None = None

    # The address the gateway binds (set by ``streamserve gateway --host``): admin writes take it as a Host.
    bind_host: str | None = None

    # How often a replica refreshes its heartbeat.
    heartbeat_interval_s: float = Field(1.0, gt=0)

    # A replica whose heartbeat is older than this is considered dead.
    heartbeat_timeout_s: float = Field(5.0, gt=0)

    # The scheduler's reconcile period.
    tick_interval_s: float = Field(0.2, gt=0)

    # A replica still STARTING after this long is stopped and replaced.
    start_timeout_s: float = Field(120.0, gt=0)

    # The largest request body a caller may send (JSON bytes); larger ones are refused (HTTP 413).
    max_request_bytes: int = Field(16 * 1024 * 1024, ge=1)

    # A request body that has not fully arrived this long after the headers gets 408 and its connection closed.
    body_timeout_s: float = Field(30.0, gt=0)

    # The request's headers together (names and values) may be at most this large; above it, 431.
    max_header_bytes: int = Field(64 * 1024, ge=1024)

    # The GPUs the scheduler hands out to replicas on this host (e.g. "0,1,2,3"; "" for none); unset: nvidia-smi -L.
    gpus: str | None = Field(None, pattern=GPU_LIST_RE.pattern)

    # How many RQ worker processes the leading scheduler keeps running for asynchronous jobs (0: none).
    job_workers: int = Field(2, ge=0)

    # How long a finished or failed job keeps its status and result in Redis.
    job_result_ttl_s: int = Field(3600, ge=1)

    # Where RQ keeps asynchronous jobs; unset: the farm's Redis. Required when that is a Redis Cluster (RQ's keys
    # span slots): a single Redis (streamserve.client.jobs.jobs_redis_url).
    jobs_redis_url: str | None = None

    # The `streamserve up` that runs this farm ("PID:START", set by `up` itself): its replicas leave when it is gone.
    supervisor: str | None = None

    # The read end of that `up`'s lifeline (runtime/lifeline.py), inherited by its scheduler and replicas; set by `up`.
    lifeline_fd: int | None = Field(None, ge=0)

    # Warn at start when Redis may lose queued work (transport.redis_checks); a process that has warned passes
    # False to the processes it starts, so that they do not repeat it.
    check_redis: bool = True

    # Send user tracebacks in error replies and log at DEBUG.
    debug: bool = False

    # How every process logs: "text" (one line per record) or "json" (one JSON object per line).
    log_format: Literal["text", "json"] = "text"

    # The gateway logs one access line per request (method, path, status, ms, request id, deployment, replica).
    access_log: bool = True

    # Processes count requests and handler times and flush them to Redis for the gateways' ``/metrics``.
    metrics: bool = True

    # A gateway connection whose request headers are not all in this long after it opened (or, on a kept-alive
    # connection, after the request's first byte) is closed, with a 408 if part of a request came.
    header_timeout_s: float = Field(10.0, gt=0)

    # A kept-alive gateway connection with no request for this long is closed. Longer than HTTP clients keep an idle
    # connection in their pools (httpx 5 s, aiohttp 15 s, load balancers 60 s): a client that reuses one just as the
    # server closes it gets its request reset (uvicorn's 5 s, the same as httpx's, did that now and then).
    keep_alive_s: float = Field(75.0, gt=0)

    # The most client connections one gateway process holds; beyond, the one waiting longest without a request in
    # progress is closed, or (all busy) the new one gets 503. Unset: 10000, within what the open-file limit allows.
    max_connections: int | None = Field(None, ge=1)

    # The maxima of counts and sizes in a config that this process writes, over the defaults of
    # wire/limits.py's ConfigLimits: "NAME=N" pairs separated by commas, e.g. "num_replicas=4096".
    config_limits: str | None = None

    @field_validator("api_key", mode="before")
    @classmethod
    def _key_is_not_blank(cls, value: object) -> object:
        """A key a header can carry as it is (api_key_problem)."""
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(text, str) and (problem := api_key_problem(text)):
            raise ValueError(problem)
        return value

    @field_validator("heartbeat_timeout_s")
    @classmethod
    def _timeout_spans_beats(cls, value: float, info: ValidationInfo) -> float:
        """A replica heartbeats every interval and is written off (killed, replaced) once silent for the timeout, and
        one silent for half of it beats again before it runs what it read: a timeout under two intervals kills every
        replica over and over."""
        interval = info.data.get("heartbeat_interval_s")  # (absent when it was refused itself)
        if interval is not None and value < 2 * interval:
            raise ValueError(
                f"{value:g}s is under twice STREAMSERVE_HEARTBEAT_INTERVAL_S ({interval:g}s): replicas would be "
                "written off between their heartbeats"
            )
        return value

    @field_validator("redis_cluster_nodes")
    @classmethod
    def _cluster_nodes_parse(cls, value: str | None) -> str | None:
        if value is not None:
            parse_nodes(value)  # ValueError: pydantic names the setting
        return value

    @field_validator("redis_url", "jobs_redis_url", mode="before")
    @classmethod
    def _blank_url_is_none(cls, value: object, info: ValidationInfo) -> object:
        """``REDIS_URL=`` (set, but empty) names no Redis: the farm `up` runs here is found as when it is unset (it
        meant the default, 127.0.0.1:6379, whichever farm that is). A blank ``STREAMSERVE_REDIS_URL`` leaves
        ``REDIS_URL`` to say (pydantic takes the first variable set, empty or not). Otherwise a Redis URL redis-py can
        take apart, refused here, where every command and role builds its settings, rather than where it connects."""
        if isinstance(value, str) and not value.strip():
            if info.field_name == "redis_url" and (plain := os.environ.get("REDIS_URL", "")).strip():
                return cls._blank_url_is_none(plain, info)
            return None
        if isinstance(value, str) and (problem := redis_url_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("import_allow")
    @classmethod
    def _allow_list_parses(cls, value: str | None) -> str | None:
        ImportAllowList.parse(value)
        return value

    @field_validator("config_limits")
    @classmethod
    def _config_limits_parse(cls, value: str | None) -> str | None:
        ConfigLimits.parse(value)
        return value

    @classmethod
    def from_command_line(cls, args: argparse.Namespace, **overrides: object) -> Settings:
        """The environment's settings, with ``--redis-url`` (see add_redis_url_option) and ``overrides`` on top.

        ConfigError (exit 2 at the entry points) names the setting that is wrong.
        """
        if getattr(args, "redis_url", None):
            overrides["redis_url"] = args.redis_url
        if getattr(args, "no_admin", False):
            overrides["admin"] = False
        return cls.checked(**overrides)

    @classmethod
    def checked(cls, **overrides: object) -> Settings:
        """The environment's settings with ``overrides`` on top, where a wrong one raises ConfigError (a
        StreamServeError, exit 2 at the entry points) naming the setting, not pydantic's ValidationError."""
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            problems = "; ".join(
                f"{_setting_name(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
            )
            raise ConfigError(problems) from None

    def tenant_key_map(self) -> TenantKeys | None:
        """The API keys of ``tenant_keys``, None when it is unset; ConfigError (exit 2) naming the file when it
        cannot be read or parsed: a gateway never starts admitting everyone instead."""
        if self.tenant_keys is None:
            return None
        if not self.tenant_keys.strip():  # (a variable meant to be filled in that was not: never "no keys")
            raise ConfigError("STREAMSERVE_TENANT_KEYS is set but empty: name the tenant keys file, or unset it")
        try:
            text = Path(self.tenant_keys).read_text(encoding="utf-8-sig")  # a BOM (Notepad's) is no part of a key
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"STREAMSERVE_TENANT_KEYS: cannot read {self.tenant_keys}: {exc}") from None
        return TenantKeys.parse(text, f"STREAMSERVE_TENANT_KEYS ({self.tenant_keys})")

    @property
    def import_allow_list(self) -> ImportAllowList:
        return ImportAllowList.parse(self.import_allow)

    @property
    def config_limit_values(self) -> ConfigLimits:
        """The maxima a config this process writes is checked against (``config_limits`` over the defaults)."""
        return ConfigLimits.parse(self.config_limits)

    def give_cluster_nodes(self) -> None:
        """Make this process's Redis clients try ``redis_cluster_nodes`` too, when the URL's node is down."""
        give_nodes(self.effective_redis_url, self.redis_cluster_nodes)

    @property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)

    @property
    def effective_redis_url(self) -> str:
        """The URL to connect with: ``redis_url`` (or the default), with ``redis_password`` put in if it has none."""
        url = self.redis_url or DEFAULT_REDIS_URL
        if self.redis_password is None:
            return url
        parts = urlsplit(url)
        if parts.password is not None or parts.scheme == "unix":
            return url if parts.scheme != "unix" else _with_query(url, "password", self.redis_password)
        user = quote(parts.username or "", safe="")
        password = quote(self.redis_password.get_secret_value(), safe="")
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))

    @property
    def effective_jobs_redis_url(self) -> str:
        """The Redis RQ keeps asynchronous jobs in: ``jobs_redis_url``, else the farm's (streamserve.client.jobs.
        jobs_redis_url refuses a Redis Cluster)."""
        return self.jobs_redis_url or self.effective_redis_url

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process build equal Settings."""
        env = {
            "REDIS_URL": self.effective_redis_url,
            "STREAMSERVE_KEY_PREFIX": self.key_prefix,
            "STREAMSERVE_HEARTBEAT_INTERVAL_S": str(self.heartbeat_interval_s),
            "STREAMSERVE_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
            "STREAMSERVE_TICK_INTERVAL_S": str(self.tick_interval_s),
            "STREAMSERVE_START_TIMEOUT_S": str(self.start_timeout_s),
            "STREAMSERVE_MAX_REQUEST_BYTES": str(self.max_request_bytes),
            "STREAMSERVE_BODY_TIMEOUT_S": str(self.body_timeout_s),
            "STREAMSERVE_MAX_HEADER_BYTES": str(self.max_header_bytes),
            "STREAMSERVE_JOB_WORKERS": str(self.job_workers),
            "STREAMSERVE_JOB_RESULT_TTL_S": str(self.job_result_ttl_s),
            "STREAMSERVE_DEBUG": "1" if self.debug else "0",
            "STREAMSERVE_ADMIN": "on" if self.admin else "off",
            "STREAMSERVE_LOG_FORMAT": self.log_format,
            "STREAMSERVE_ACCESS_LOG": "1" if self.access_log else "0",
            "STREAMSERVE_METRICS": "1" if self.metrics else "0",
            "STREAMSERVE_HEADER_TIMEOUT_S": str(self.header_timeout_s),
            "STREAMSERVE_KEEP_ALIVE_S": str(self.keep_alive_s),
        }
        if self.max_connections is not None:
            env["STREAMSERVE_MAX_CONNECTIONS"] = str(self.max_connections)
        if self.config_limits is not None:
            env["STREAMSERVE_CONFIG_LIMITS"] = self.config_limits
        if self.import_allow is not None:
            env["STREAMSERVE_IMPORT_ALLOW"] = self.import_allow
        if self.tenant_keys is not None:
            env[TENANT_KEYS_ENV] = self.tenant_keys
        for name in ("allowed_hosts", "allowed_origins", "bind_host"):
            if (value := getattr(self, name)) is not None:
                env[f"STREAMSERVE_{name.upper()}"] = value
        if self.jobs_redis_url is not None:
            env["STREAMSERVE_JOBS_REDIS_URL"] = self.jobs_redis_url
        if self.gpus is not None:
            env["STREAMSERVE_GPUS"] = self.gpus
        if self.supervisor is not None:
            env["STREAMSERVE_SUPERVISOR"] = self.supervisor
        if self.lifeline_fd is not None:
            env["STREAMSERVE_LIFELINE_FD"] = str(self.lifeline_fd)
        if not self.check_redis:
            env["STREAMSERVE_CHECK_REDIS"] = "0"
        if self.api_key is not None:
            env[API_KEY_ENV] = self.api_key.get_secret_value()
        return env

    def user_code_env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The environment of a process that is no gateway (a replica, a job worker): ``inherited`` and ``to_env()``
        without the gateway's secrets, which user code must not be able to read."""
        env = {**inherited, **self.to_env()}
        for name in GATEWAY_SECRETS_ENV:
            env.pop(name, None)
        return env


# STREAMSERVE_ names that are no setting of a streamserve process, and what reads them.
OTHER_ENV_NAMES = {"STREAMSERVE_REDIS_MAXMEMORY": "docker/compose.yaml"}


def setting_env_names() -> frozenset[str]:
    """The environment variables a streamserve process reads its settings from (Settings' fields, by name or alias)."""
    names = set(OTHER_ENV_NAMES)
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(choice for choice in alias.choices if isinstance(choice, str))
        else:
            names.add(f"STREAMSERVE_{name.upper()}")
    return frozenset(names)


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``STREAMSERVE_`` variable of ``environ`` that is no setting, naming the nearest one: a misspelt
    name (``STREAMSERVE_API_KEYS``) is otherwise ignored without a word, and the gateway runs without its key."""
    prefix = "STREAMSERVE_"
    known = setting_env_names()  # (names are read whatever their case, as pydantic-settings reads them)
    endings = sorted(name.removeprefix(prefix) for name in known if name.startswith(prefix))
    lines = []
    for name in sorted(environ):
        if name.upper().startswith(prefix) and name.upper() not in known:
            near = difflib.get_close_matches(name.upper().removeprefix(prefix), endings, n=1, cutoff=0.6)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else " (docs/configuration.md lists the settings)"
            lines.append(f"{name} is not a streamserve setting and is ignored{hint}")
    return lines


def forget_gateway_secrets(command: list[str]) -> None:
    """Take the gateway's secrets out of this process's environment: a process that runs user code and was started
    with them (a systemd unit or a compose service sharing the gateway's environment) must not show them to it, nor
    pass them on. Out of ``os.environ`` alone, they would still be in the environment it started with, which
    ``/proc/self/environ`` shows: the process starts again without them, as ``command`` (runtime.processes'
    role_command: its open inheritable files stay), before it imports any user code."""
    if not any(name in os.environ for name in GATEWAY_SECRETS_ENV):
        return
    env = {name: value for name, value in os.environ.items() if name not in GATEWAY_SECRETS_ENV}
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(command[0], command, env)


def _with_query(url: str, name: str, secret: SecretStr) -> str:
    """A unix:// URL takes its password as a query parameter (unless it has one)."""
    if f"{name}=" in urlsplit(url).query:
        return url
    return url + ("&" if "?" in url else "?") + urlencode({name: secret.get_secret_value()})
