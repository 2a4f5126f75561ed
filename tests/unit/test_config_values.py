"""Config values that must not be accepted: a route_prefix is a URL path of safe characters, and a config file's
name cannot add a document to `streamserve manifests` (issue 27, defect 7)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from streamserve.cli.main import main
from streamserve.wire.config import DeploymentConfig, EndpointConfig, parse_config
from streamserve.wire.errors import ConfigError
from tests.harness.paths import ROOT
from tests.unit.test_manifests import CONFIG, K8S_VERSION


def dep(**fields: object) -> dict[str, object]:
    return {"name": "echo", "import_path": "examples.echo:Echo", **fields}


@pytest.mark.parametrize(
    ("route", "why"),
    [
        ("/a\nb", "holds a character a route may not"),
        ("/a\n", "holds a character a route may not"),  # ($ in a pattern matches before a last line break)
        ("/echo\r\nX-Forged: 1", "holds a character a route may not"),
        ("/\x1b[2Jx", "holds a character a route may not"),
        ("/\x1b]52;c;cHduZWQ=\x07", "holds a character a route may not"),
        ("/<script>alert(1)</script>", "holds a character a route may not"),
        ("/abc\u202egnp.exe", "holds a character a route may not"),
        ("/caf\u00e9", "holds a character a route may not"),
        ("/a b", "holds a character a route may not"),
        ("/a%2fb", "holds a character a route may not"),
        ('/a"b', "holds a character a route may not"),
        ("/a//b", "has an empty segment"),
        ("/a/./b", "has a '.' segment"),
        ("/..", "has a '..' segment"),
        ("/" + "a" * 256, "is 257 characters long; at most 256"),
    ],
)
def test_a_route_prefix_that_is_not_a_safe_url_path_is_refused(route: str, why: str) -> None:
    for data in ({"deployments": [dep(route_prefix=route)]}, {"endpoints": [{"name": "e", "route_prefix": route}]}):
        with pytest.raises(ConfigError) as info:
            parse_config(data, "farm.yaml")
        assert why in str(info.value)
        assert "route_prefix:" in str(info.value)


@pytest.mark.parametrize("route", ["/", "/echo", "/v1/models/bert-base_uncased", "/a.b~c", "/" + "a" * 255])
def test_ordinary_routes_are_accepted(route: str) -> None:
    assert parse_config({"deployments": [dep(route_prefix=route)]}).deployments[0].route_prefix == route


def test_a_route_stored_before_the_rule_still_reads_back() -> None:
    """A farm upgraded under a stored route the rule now refuses keeps running; only writes are checked."""
    stored = b'{"name": "echo", "import_path": "examples.echo:Echo", "route_prefix": "/a b"}'
    assert DeploymentConfig.from_json(stored).route_prefix == "/a b"
    assert EndpointConfig.from_json(b'{"name": "e", "route_prefix": "/a b", "traffic": {"x": 1}}').route_prefix


def test_every_shipped_config_and_the_tests_routes_pass_the_rule() -> None:
    for path in sorted([*(ROOT / "examples").rglob("*.yaml"), *(ROOT / "tests").rglob("*.yaml")]):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "deployments" in data:
            parse_config(data, str(path))


# -- `streamserve manifests` from a file whose name holds a document -------------

FORGED_NAME = "farm.yaml\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: pwned}\nstringData: {k: v}\n#"


def manifests(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[dict[str, Any]]]:
    assert main(["manifests", str(config), "--image", "registry.example/farm:1.0", "--namespace", "ml"]) == 0
    out = capsys.readouterr().out
    return out, [doc for doc in yaml.safe_load_all(out) if doc is not None]


@pytest.mark.parametrize(
    "name",
    [
        FORGED_NAME,
        "farm.yaml\r--- {kind: Secret}",
        "farm\u0085--- {kind: Secret}.yaml",  # NEL, U+2028, U+2029: line breaks to YAML too
        "farm\u2028--- {kind: Secret}\u2029.yaml",
        "farm\x1b[2J\u202e.yaml",
    ],
)
def test_a_config_file_name_cannot_add_a_document_to_the_manifests(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, forged = tmp_path / "farm.yaml", tmp_path / "forged"
    forged.mkdir()
    plain.write_text(CONFIG)
    (forged / name).write_text(CONFIG)
    _, expected = manifests(plain, capsys)
    out, docs = manifests(forged / name, capsys)
    assert docs == expected  # the same objects, no Secret among them
    assert all(doc["kind"] != "Secret" for doc in docs)
    header = out.split("\n---\n", 1)[0]
    assert all(line.startswith("# ") for line in header.splitlines()), header
    assert header.isascii() and header.replace("\n", "").isprintable(), header
    for doc in docs:
        if not doc["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", ["echo\n", "echo\r\n"])
def test_a_name_ending_in_a_line_break_is_refused(name: str) -> None:
    """A pattern's ``$`` matches before a last line break: "echo\\n" was a deployment name, and a key in Redis."""
    with pytest.raises(ConfigError, match="is not a valid name"):
        parse_config({"deployments": [dep(name=name)]})
    with pytest.raises(ConfigError, match="is not a valid name"):
        parse_config({"endpoints": [{"name": name, "traffic": {"echo": 1}}]})


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"user_config": {"x": float("inf")}}, "user_config: inf has no JSON form (it would be stored as null)"),
        ({"init_kwargs": {"x": float("nan")}}, "init_kwargs: nan has no JSON form"),
        ({"init_args": [[1.0e999]]}, "init_args: inf has no JSON form"),
        ({"user_config": {5: "b"}}, "user_config: the key 5 is not a string, as a JSON object's keys are (quote it)"),
        ({"user_config": {"a": [{None: 1}]}}, "user_config: the key None is not a string"),
    ],
)
def test_a_config_value_json_would_change_is_refused(fields: dict[str, Any], why: str) -> None:
    """They were stored as null, and as "5" or "None" beside YAML's "true": never the value the file gave."""
    with pytest.raises(ConfigError, match=re.escape(why)):
        parse_config({"deployments": [dep(**fields)]}, "c.yaml")
