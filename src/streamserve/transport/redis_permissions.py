"""Whether the farm's Redis user may do what the farm does: asked once at start, as the durability check is.

A Redis ACL user that misses one rule of the line docs/operations.md prints (Security) was not caught
until the command that needed it: the scheduler died on its first script, three times with a traceback,
or a config subscription retried for ever. Each probe here is a harmless command of one kind the farm
uses, on a key or channel named as the farm's are (read-only, or a no-op on a key nobody uses); Redis
checks a command's permissions before it runs it (and before a cluster's redirection), so a refusal
names what is missing. The probes go in one round trip; a Redis that cannot be reached is not judged
here (the process reports that itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.exceptions import NoPermissionError
from redis.typing import EncodableT

from streamserve.transport.connections import one_shot_redis, redacted
from streamserve.wire.errors import ConfigError
from streamserve.wire.keys import Keys

# A name no farm gives a deployment or key (a deployment name has no "!"): the probes touch nothing real.
PROBE_NAME = "permission-check!"


@dataclass(frozen=True)
class Probe:
    """A command, the ACL rule that allows it, and the rule for the keys or channel it names (if any)."""

    command: tuple[EncodableT, ...]
    rule: str
    names: str = ""

    def missing(self, refusal: NoPermissionError) -> str:
        """Which rule ``refusal`` (Redis's NOPERM for this command) says is missing."""
        words = str(refusal)
        return self.names if self.names and ("keys" in words or "channels" in words) else self.rule


def farm_probes(keys: Keys) -> list[Probe]:
    """One command of each kind the farm's processes send, on keys and a channel named as theirs."""
    farm_key = keys.deployments()  # {prefix}:... (farm-wide keys)
    farm_keys = f"the keys {farm_key.rpartition(':')[0]}:*"
    deployment_key = keys.requests(PROBE_NAME)  # prefix:{deployment}:... (a deployment's keys)
    deployment_keys = f"the keys {keys.prefix}:*"
    channel = f"{keys.config_channel()}:{PROBE_NAME}"
    return [
        Probe(("EVAL", "return 1", 0), "+@scripting"),
        Probe(("PUBLISH", channel, ""), "+@pubsub", f"the channels {keys.config_channel().rpartition(':')[0]}:*"),
        Probe(("MULTI",), "+@transaction"),
        Probe(("DISCARD",), "+@transaction"),
        Probe(("EXISTS", farm_key), "+@keyspace", farm_keys),
        Probe(("HLEN", farm_key), "+@hash", farm_keys),
        Probe(("XLEN", deployment_key), "+@stream", deployment_keys),
        Probe(("ZCARD", deployment_key), "+@sortedset", deployment_keys),
        Probe(("LLEN", deployment_key), "+@list", deployment_keys),
        Probe(("SCARD", deployment_key), "+@set", deployment_keys),
        Probe(("STRLEN", deployment_key), "+@string", deployment_keys),
        Probe(("PEXPIRE", deployment_key, 1), "+@write", deployment_keys),
        Probe(("TIME",), "+time"),
    ]


def job_probes() -> list[Probe]:
    """What RQ's job workers and enqueues send beyond the farm's own kinds (on RQ's ``rq:`` keys)."""
    return [
        Probe(("EXISTS", f"rq:{PROBE_NAME}"), "+@keyspace", "the keys rq:*"),
        Probe(("INFO", "server"), "+info"),
        Probe(("CLIENT", "SETNAME", "streamserve-permission-check"), "+client|setname"),
    ]


def refused(url: str, probes: list[Probe]) -> dict[str, str]:
    """What the user of ``url`` may not do among ``probes``: each missing rule, with Redis's words for its first
    refusal; none when all are allowed, or when Redis cannot be asked."""
    client = one_shot_redis(url)
    try:
        pipe = client.pipeline(transaction=False)
        for probe in probes:
            pipe.execute_command(*probe.command)  # type: ignore[no-untyped-call]
        answers = pipe.execute(raise_on_error=False)
    except redis.RedisError:
        return {}
    finally:
        client.close()
    missing: dict[str, str] = {}
    for probe, answer in zip(probes, answers, strict=True):
        if isinstance(answer, NoPermissionError):
            missing.setdefault(probe.missing(answer), str(answer))
    return missing


def check_permissions(url: str, keys: Keys, jobs_url: str | None) -> None:
    """ConfigError naming each rule the Redis user lacks, for the farm at ``url`` and (``jobs_url``: where RQ keeps
    asynchronous jobs, None when they are off) its jobs."""
    missing = refused(url, farm_probes(keys))
    if jobs_url is not None:
        for rule, words in refused(jobs_url, job_probes()).items():
            missing.setdefault(rule, words)
    if missing:
        listed = "".join(f"\n  - {rule} (Redis: {words})" for rule, words in missing.items())
        raise ConfigError(
            f"the Redis user of {redacted(url)} lacks permissions the farm needs:{listed}\n"
            "docs/operations.md (Security) gives the ACL line a farm's user needs"
        )
