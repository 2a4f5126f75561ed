"""The nodes of a Redis Cluster a process knows besides its URL's, and hands on to the processes it starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from streamserve.client.sync_client import Client
from streamserve.runtime.settings import Settings
from streamserve.scheduler.launcher import ProcessLauncher
from streamserve.transport import cluster_nodes
from streamserve.transport.cluster_nodes import CLUSTER_NODES_ENV, found_by, give_nodes, known_nodes, parse_nodes


def nodes_manager(*addresses: tuple[str, int]) -> SimpleNamespace:
    """What redis-py's NodesManager shows of the nodes it knows."""
    return SimpleNamespace(nodes_cache={f"{h}:{p}": SimpleNamespace(host=h, port=p) for h, p in addresses})


@pytest.fixture(autouse=True)
def nothing_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_nodes, "_GIVEN", {})
    monkeypatch.setattr(cluster_nodes, "_FOUND", {})


def test_nodes_parse_and_a_bad_one_is_named() -> None:
    assert parse_nodes(" 10.0.0.1:7000,[::1]:7001,, ") == [("10.0.0.1", 7000), ("::1", 7001)]
    with pytest.raises(ValueError, match="'node-b' is not host:port"):
        parse_nodes("node-a:7000,node-b")
    with pytest.raises(ValidationError, match=CLUSTER_NODES_ENV):
        Settings.model_validate({CLUSTER_NODES_ENV: "node-a:99999"})


def test_a_process_knows_what_its_clients_found_first_then_what_it_was_given_never_its_urls_node() -> None:
    url = "redis://user:secret@10.0.0.1:7000/0"
    give_nodes(url, "10.0.0.1:7000,10.0.0.9:7000")
    assert known_nodes(url) == [("10.0.0.9", 7000)]
    found = nodes_manager(("10.0.0.1", 7000), ("10.0.0.2", 7000))
    found_by(url, found)
    assert known_nodes(url) == [("10.0.0.2", 7000), ("10.0.0.9", 7000)]
    found.nodes_cache = nodes_manager(("10.0.0.3", 7000)).nodes_cache  # a failover, seen by the client
    assert known_nodes(url) == [("10.0.0.3", 7000), ("10.0.0.9", 7000)]
    assert known_nodes("redis://10.0.0.5:6379/0") == []
    # A URL without a port names the node on 6379.
    give_nodes("redis://10.0.0.1/0", "10.0.0.1:6379,10.0.0.2:6379")
    assert known_nodes("redis://10.0.0.1/0") == [("10.0.0.2", 6379)]


def test_a_client_of_a_users_program_takes_the_nodes_of_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only the roles: a program's own Client tries the nodes STREAMSERVE_REDIS_CLUSTER_NODES names."""
    monkeypatch.setenv(CLUSTER_NODES_ENV, "10.0.0.2:7000")
    Client("redis://10.0.0.1:7000/0").close()
    assert known_nodes("redis://10.0.0.1:7000/0") == [("10.0.0.2", 7000)]


def test_a_replica_is_started_with_the_cluster_nodes_known_at_its_start() -> None:
    settings = Settings(redis_url="redis://10.0.0.1:7000/0")
    launcher = ProcessLauncher(settings)
    assert CLUSTER_NODES_ENV not in launcher.env()  # a single server, or no other node known
    found_by(settings.effective_redis_url, nodes_manager(("10.0.0.2", 7000), ("::1", 7001)))
    assert launcher.env()[CLUSTER_NODES_ENV] == "10.0.0.2:7000,[::1]:7001"
