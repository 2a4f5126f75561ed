"""The nodes of a Redis Cluster that a process knows besides the one its URL names, and hands on to those it starts.

A process pointed at one node of a cluster ("any node", docs/operations.md) finds the others through it, once. A
process started while that node is down (a replacement replica after a failover, say) would not find the cluster at
all, however healthy the rest of it: so a process that starts others hands them the nodes it knows
(CLUSTER_NODES_ENV), and a process connecting to a cluster tries every node it was given, not only the URL's.
"""

from __future__ import annotations

import collections
import urllib.parse
from collections.abc import Iterable
from typing import Any

# The environment variable that carries them: "host:port,host:port,..." ([host]:port for an IPv6 address). Set by
# `up` and the scheduler on the processes they start; a user may set it too (runtime/settings.py reads it).
CLUSTER_NODES_ENV = "STREAMSERVE_REDIS_CLUSTER_NODES"

# URL -> the nodes this process was given for it, in the order given.
_GIVEN: dict[str, list[tuple[str, int]]] = {}
# URL -> the node maps of the last cluster clients made for it: redis-py keeps each up to date (a failed master
# leaves it, its replica comes in), and it stays readable after its client is closed.
_FOUND: dict[str, collections.deque[Any]] = {}
_FOUND_KEPT = 4
DEFAULT_PORT = 6379  # a URL's port when it names none (redis-py's)


def parse_nodes(text: str) -> list[tuple[str, int]]:
    """``"host:port,..."`` as (host, port) pairs; ValueError naming the item that is not one."""
    nodes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, port = item.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not host:port")
        nodes.append((host, int(port)))
    return nodes


def format_nodes(nodes: Iterable[tuple[str, int]]) -> str:
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in nodes)


def give_nodes(url: str, text: str | None) -> None:
    """Remember the nodes in ``text`` (CLUSTER_NODES_ENV's value, if set) as more ways into ``url``'s cluster."""
    if text:
        _GIVEN[url] = parse_nodes(text)


def found_by(url: str, nodes_manager: Any) -> None:
    """Remember a cluster client's node map (redis-py's NodesManager): the nodes it finds are known from now on."""
    _FOUND.setdefault(url, collections.deque(maxlen=_FOUND_KEPT)).appendleft(nodes_manager)


def known_nodes(url: str) -> list[tuple[str, int]]:
    """Every node of ``url``'s cluster this process knows other than the URL's own: those its clients found (the
    latest first), then those it was given."""
    own = urllib.parse.urlsplit(url)
    known: dict[tuple[str, int], None] = {}
    for nodes_manager in _FOUND.get(url, ()):
        for node in list(nodes_manager.nodes_cache.values()):
            known[(node.host, int(node.port))] = None
    for node in _GIVEN.get(url, ()):
        known[node] = None
    known.pop((own.hostname or "", own.port or DEFAULT_PORT), None)
    return list(known)


def nodes_env(url: str) -> dict[str, str]:
    """What a process started now gets in its environment to find ``url``'s cluster: CLUSTER_NODES_ENV, with the
    nodes known now ({} when none: no cluster, or no other node known)."""
    nodes = known_nodes(url)
    return {CLUSTER_NODES_ENV: format_nodes(nodes)} if nodes else {}
