"""What `streamserve up` leaves in its data directory for the commands run beside it: the admin token, the embedded
Redis's password, the farm.

``<data dir>/api_key`` holds the token admin writes need when no
``STREAMSERVE_API_KEY`` is set; it is made once and kept, so that scripts
which read it keep working across restarts. ``<data dir>/farm.json`` says
where the running farm's Redis and gateway are, so that ``streamserve
status`` in the same directory finds them. ``<data dir>/redis_password`` is
the embedded Redis's. All are mode 0600: the Redis URL may hold a password,
and the token deploys code.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import orjson

from streamserve.runtime.processes import process_ref
from streamserve.runtime.settings import Settings, api_key_problem
from streamserve.wire.errors import ConfigError

# Where `up` keeps its files (and the embedded Redis its data) unless --data-dir says otherwise.
DEFAULT_DATA_DIR = Path(".streamserve")
TOKEN_FILE = "api_key"
# The password of the embedded Redis: whoever can write Redis can deploy code (docs: "Redis is the trust boundary"),
# and a loopback port is open to every user of the machine.
REDIS_PASSWORD_FILE = "redis_password"
FARM_FILE = "farm.json"
# Held (flock) by the `up` that runs from the directory, for as long as it runs.
LOCK_FILE = "up.lock"
PRIVATE = 0o600


class UnsafeFileError(ConfigError):
    """A token or farm file that others may read or write: refused rather than trusted."""


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only (never briefly readable by others)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def keep_private(data_dir: Path) -> None:
    """Make ``data_dir`` this user's alone (0700): it holds the embedded Redis's files (requests, replies, configs)
    beside the secrets. UnsafeFileError when another user owns it (who could replace what is in it)."""
    info = data_dir.stat()
    if info.st_uid != os.getuid():
        raise UnsafeFileError(f"{data_dir} belongs to another user: give `up` a --data-dir of your own")
    if stat.S_IMODE(info.st_mode) & (stat.S_IRWXG | stat.S_IRWXO):
        data_dir.chmod(0o700)


def _read_private(path: Path) -> bytes | None:
    """The file's bytes; None when it does not exist; UnsafeFileError when others could read or change it."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or info.st_uid != os.getuid():
        raise UnsafeFileError(f"{path} may be read or changed by other users: remove it, `up` makes it again")
    return path.read_bytes()


def api_key_path(data_dir: Path | None) -> Path:
    return (data_dir or DEFAULT_DATA_DIR) / TOKEN_FILE


def ensure_api_key(data_dir: Path | None) -> str:
    """The token in the data directory, made (random, 256 bits) if there is none yet. ConfigError names the file
    when one put there by hand is not a token a header carries."""
    path = api_key_path(data_dir)
    key = _ensure_secret(path)
    if problem := api_key_problem(key):
        raise ConfigError(f"{path}: the token {problem} (or delete the file: `up` makes one)")
    return key


def redis_password_path(data_dir: Path | None) -> Path:
    return (data_dir or DEFAULT_DATA_DIR) / REDIS_PASSWORD_FILE


def ensure_redis_password(data_dir: Path | None) -> str:
    """The embedded Redis's password in the data directory, made (random, 256 bits) if there is none yet. One put
    there by hand may be any printable ASCII but a space, a quote or a backslash (redis-server's config line would
    read those otherwise); ConfigError names the file when it is not."""
    path = redis_password_path(data_dir)
    password = _ensure_secret(path)
    if not all("!" <= char <= "~" and char not in "\"'\\" for char in password):
        raise ConfigError(
            f"{path}: the password holds a space, a quote, a backslash or a character beyond printable ASCII; "
            "put another one there (or delete the file: `up` makes one)"
        )
    return password


def _ensure_secret(path: Path) -> str:
    """The secret kept in ``path``, made (random, 256 bits, URL-safe) if there is none yet; kept across restarts,
    so that scripts which read it keep working."""
    existing = _read_private(path)
    if existing is not None and existing.strip():
        return existing.decode().strip()
    secret = secrets.token_urlsafe(32)
    _write_private(path, secret.encode() + b"\n")
    return secret


def read_api_key(data_dir: Path | None) -> str | None:
    existing = _read_private(api_key_path(data_dir))
    return (existing.decode().strip() or None) if existing is not None else None


@dataclass(frozen=True)
class FarmRecord:
    """The running `up`: its process (``pid:start``, see runtime.processes.process_ref) and where it serves."""

    supervisor: str
    redis_url: str
    gateway_url: str
    # Its STREAMSERVE_IMPORT_ALLOW: a command run beside it checks a deploy as its processes would.
    import_allow: str | None = None

    def is_running(self) -> bool:
        pid = self.supervisor.partition(":")[0]
        return pid.isdigit() and process_ref(int(pid)) == self.supervisor

    def serving(self, settings: Settings) -> Settings:
        """``settings`` for a command or client that works on this farm: its Redis, and its import allow-list
        unless the command has one of its own."""
        update: dict[str, str | None] = {"redis_url": self.redis_url}
        if settings.import_allow is None:
            update["import_allow"] = self.import_allow
        return settings.model_copy(update=update)


def write_farm(data_dir: Path | None, record: FarmRecord) -> None:
    _write_private((data_dir or DEFAULT_DATA_DIR) / FARM_FILE, orjson.dumps(record.__dict__))


def remove_farm(data_dir: Path | None, supervisor: str) -> None:
    """Forget the farm file, if it is still this supervisor's (another `up` may have taken the directory)."""
    path = (data_dir or DEFAULT_DATA_DIR) / FARM_FILE
    with contextlib.suppress(OSError, UnsafeFileError, ValueError, TypeError):
        record = read_farm_file(path)
        if record is not None and record.supervisor == supervisor:
            path.unlink()


def read_farm_file(path: Path) -> FarmRecord | None:
    raw = _read_private(path)
    return None if raw is None else FarmRecord(**orjson.loads(raw))


def dead_farm(data_dir: Path | None) -> FarmRecord | None:
    """The farm file of an `up` from this data directory that no longer runs (killed with -9, it could not remove
    it); None when there is none, or it is unreadable, or its `up` runs."""
    try:
        record = read_farm_file((data_dir or DEFAULT_DATA_DIR) / FARM_FILE)
    except (OSError, ValueError, TypeError):
        return None
    return record if record is not None and record.supervisor and not record.is_running() else None


def running_farm(data_dir: Path | None) -> FarmRecord | None:
    """The farm `up` runs from this data directory, if it still runs; a stale or unreadable file counts as none."""
    try:
        record = read_farm_file((data_dir or DEFAULT_DATA_DIR) / FARM_FILE)
    except (OSError, ValueError, TypeError):
        return None
    return record if record is not None and record.is_running() else None


def default_redis_hint(data_dir: Path | None, fixes: str) -> str:
    """What to add to a failure to reach the default Redis, tried because no Redis was given and no farm runs from
    ``data_dir`` (running_farm); ``fixes``: how the caller names one, in its own terms (options, arguments)."""
    return f" (no `streamserve up` runs from {data_dir or DEFAULT_DATA_DIR}/, so the default Redis was tried: {fixes})"
