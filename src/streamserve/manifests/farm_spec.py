"""What the manifests are made from: the config, the image, the namespace, the farm's Redis.

Also the names every object file shares: the Secret the user creates and
its keys, and the objects the others refer to by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from streamserve.control.security import ImportAllowList
from streamserve.runtime.embedded_redis import DEFAULT_PORT
from streamserve.wire.config import MEMORY_RE, AppConfig, load_config, memory_bytes
from streamserve.wire.errors import ConfigError
from streamserve.wire.keys import Keys
from streamserve.wire.limits import ConfigLimits

Manifest = dict[str, Any]

PART_OF = "streamserve"
# The Secret the user creates (kubectl create secret generic streamserve ...) and its keys.
SECRET_NAME = "streamserve"
API_KEY_KEY = "api-key"
REDIS_PASSWORD_KEY = "redis-password"

REDIS_NAME = "streamserve-redis"
REDIS_PORT = DEFAULT_PORT  # the port every Redis listens on unless told otherwise
# The in-cluster Redis container's memory (request and limit) unless --redis-memory says otherwise.
DEFAULT_REDIS_MEMORY = "1Gi"
CONFIG_MAP_NAME = "streamserve-config"
TRIGGER_AUTH_NAME = "streamserve-redis-auth"
# A DNS-1123 label: what Service names, and the names and labels here, must be.
K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")

# A container image reference, as the kubelet's runtime parses it (docker distribution's reference grammar, with
# its normalisation: the first component is a registry only when it holds '.' or ':' or is localhost, else it is
# part of the repository path and must be lowercase like the rest).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
# Used with fullmatch: a "$" would let a trailing "\n" through.
IMAGE_DOMAIN_RE = re.compile(_DOMAIN)
IMAGE_PATH_RE = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
IMAGE_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# The digest algorithms the runtimes accept, and their hex lengths.
IMAGE_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
IMAGE_NAME_MAX = 255


def image_problem(image: str) -> str | None:
    """What makes ``image`` no image reference (``[DOMAIN/]PATH[:TAG][@ALGORITHM:HEX]``); None if it is one."""
    name, at, digest = image.partition("@")
    if at:
        algorithm, _, hex_digits = digest.partition(":")
        length = IMAGE_DIGEST_HEX.get(algorithm)
        if length is None or not re.fullmatch(rf"[a-f0-9]{{{length}}}", hex_digits):
            return f"a digest is {' or '.join(f'{a}:<{n} lowercase hex>' for a, n in IMAGE_DIGEST_HEX.items())}"
    first, slash, rest = name.partition("/")
    domain = first if slash and ("." in first or ":" in first or first == "localhost") else None
    path = rest if domain is not None else name
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    tag = None
    if colon > last_slash:
        path, tag = path[:colon], path[colon + 1 :]
    if domain is not None and not IMAGE_DOMAIN_RE.fullmatch(domain):
        return f"registry {domain!r} is no host[:port]"
    if not IMAGE_PATH_RE.fullmatch(path):
        return "a repository is lowercase letters and digits, in parts joined by '/', '.', '_', '__' or '-'"
    if tag is not None and not IMAGE_TAG_RE.fullmatch(tag):
        return "a tag is at most 128 of A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"
    if len(path) + (len(domain) + 1 if domain is not None else 0) > IMAGE_NAME_MAX:
        return f"the name is longer than {IMAGE_NAME_MAX} characters"
    return None


@dataclass(frozen=True)
class RedisTarget:
    """The Redis the farm uses: one in the namespace, or the ``--redis-url`` one."""

    url: str
    host: str
    port: int
    db: int
    tls: bool
    username: str | None
    in_cluster: bool

    @classmethod
    def in_namespace(cls, namespace: str) -> RedisTarget:
        host = f"{REDIS_NAME}.{namespace}.svc"
        return cls(f"redis://{host}:{REDIS_PORT}/0", host, REDIS_PORT, 0, False, None, in_cluster=True)

    @classmethod
    def parse(cls, url: str) -> RedisTarget:
        """An existing Redis by URL; ConfigError if it carries a password or is not host and port."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ConfigError("--redis-url must be redis://HOST:PORT/DB or rediss://... (KEDA reaches it by host)")
        if parts.password is not None or "password" in parse_qs(parts.query):
            raise ConfigError(
                "--redis-url contains a password: put the password in the Secret's "
                f"{REDIS_PASSWORD_KEY} key, not the URL (the manifests must not hold it)"
            )
        try:
            port = parts.port or REDIS_PORT
            db = int(parts.path.strip("/") or 0)
        except ValueError:
            raise ConfigError(f"--redis-url {url}: bad port or database number") from None
        if not parts.hostname:
            raise ConfigError(f"--redis-url {url}: no host")
        return cls(url, parts.hostname, port, db, parts.scheme == "rediss", parts.username or None, in_cluster=False)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class FarmSpec:
    """Everything the manifests are made from."""

    config: AppConfig
    raw: dict[str, Any]  # the config file as the user wrote it
    source: str
    image: str
    namespace: str
    redis: RedisTarget
    keys: Keys
    import_allow: str | None = None
    redis_memory: str = DEFAULT_REDIS_MEMORY  # a Kubernetes quantity; only the in-cluster Redis has one
    config_limits: str | None = None  # STREAMSERVE_CONFIG_LIMITS as given: the deploy Job checks against it too

    @property
    def limits(self) -> ConfigLimits:
        """What the config is checked against: ``config_limits`` over the defaults."""
        return ConfigLimits.parse(self.config_limits)

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        image: str | None,
        namespace: str,
        redis_url: str | None,
        keys: Keys,
        import_allow: str | None = None,
        redis_memory: str | None = None,
        config_limits: str | None = None,
    ) -> FarmSpec:
        """Read and check the inputs; ConfigError names what is wrong.

        The config is checked as the deploy Job's ``streamserve deploy`` will
        check it (``limits``, and each import_path against ``import_allow``),
        so that what is refused there is refused here, before anything runs.
        """
        if not image or not image.strip():
            raise ConfigError("--image is required: the container image with streamserve and your deployments' code")
        if problem := image_problem(image.strip()):
            raise ConfigError(
                f"--image {image.strip()!r} is not a container image reference ({problem}); "
                "e.g. registry.example.com/team/farm:1.2"
            )
        if not K8S_NAME_RE.match(namespace):
            raise ConfigError(f"--namespace {namespace!r} is not a Kubernetes namespace name (a-z, 0-9, '-')")
        if redis_memory is not None and redis_url is not None:
            raise ConfigError("--redis-memory sizes the Redis these manifests run; with --redis-url there is none")
        memory = DEFAULT_REDIS_MEMORY if redis_memory is None else redis_memory.strip()
        if not MEMORY_RE.match(memory) or memory_bytes(memory) <= 0:
            raise ConfigError(f"--redis-memory {memory!r} is not a memory size: use e.g. 512Mi or 2Gi")
        config = load_config(path, ConfigLimits.parse(config_limits))
        allowed = ImportAllowList.parse(import_allow)
        for d in config.deployments:
            allowed.check(d.import_path, d.name)
        raw = yaml.safe_load(path.read_text())  # load_config just parsed it
        redis = RedisTarget.in_namespace(namespace) if redis_url is None else RedisTarget.parse(redis_url)
        return cls(config, raw, path.name, image.strip(), namespace, redis, keys, import_allow, memory, config_limits)
