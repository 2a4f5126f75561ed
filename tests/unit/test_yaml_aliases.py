"""YAML aliases are measured before they are built (wire/yaml_text.py): a few hundred bytes of nested aliases
(``&a1 [*a0, *a0, ...]``) stood for gigabytes that validation copied before ``config_bytes`` could refuse them,
while the anchors and merge keys users share settings with still load."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamserve.wire.config import load_config
from streamserve.wire.errors import ConfigError
from streamserve.wire.limits import SETTING, ConfigLimits

# Small enough that a loader which builds the aliases first is merely slower (tens of kilobytes, not gigabytes), so
# a regression fails on the message instead of filling the memory of the machine running the tests.
LIMITS = ConfigLimits(config_bytes=10_000)


def nested_aliases(levels: int) -> str:
    """Anchors ``&a0`` .. ``&a{levels-1}``, each a list of nine of the one before: 9**levels scalars in all."""
    lines = ["      a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"      a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "farm.yaml"
    path.write_text(text)
    return path


def test_nested_aliases_are_refused_in_one_line_naming_the_limit(tmp_path: Path) -> None:
    """About 240 kB as JSON from 5 lines of aliases: refused for what the aliases add, before anything is built."""
    path = write(
        tmp_path,
        "deployments:\n  - name: bomb\n    import_path: examples.echo:Echo\n    user_config:\n"
        f"{nested_aliases(5)}\n    init_args: [*a4]\n",
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path, LIMITS)
    message = str(raised.value)
    assert message.startswith(f"{path}: its aliases (*name) would add more than 10000 bytes (config_bytes) to it")
    assert f"{SETTING}=config_bytes=N" in message
    assert "\n" not in message


def test_what_aliases_add_counts_across_deployments(tmp_path: Path) -> None:
    """Each deployment within config_bytes, but one value repeated into all of them by merge keys is more."""
    first = (
        "  - &first\n    name: d0\n    import_path: examples.echo:Echo\n    user_config:\n"
        f"{nested_aliases(3)}\n"  # 729 scalars: about 3 kB, a third of the limit
    )
    others = "".join(f"  - {{<<: *first, name: d{i}}}\n" for i in range(1, 11))
    path = write(tmp_path, f"deployments:\n{first}{others}")
    with pytest.raises(ConfigError, match=r"aliases \(\*name\) would add more than 10000 bytes"):
        load_config(path, LIMITS)
    assert len(load_config(path, ConfigLimits(config_bytes=100_000)).deployments) == 11


def test_anchors_aliases_and_merge_keys_still_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
deployments:
  - &base
    name: one
    import_path: examples.echo:Echo
    max_ongoing_requests: 4
    user_config: &shared {threshold: 0.5, labels: &labels [a, b]}
  - <<: *base
    name: two
    init_args: [*labels, *labels]
    init_kwargs: {config: *shared}
""",
    )
    one, two = load_config(path, LIMITS).deployments
    assert (two.import_path, two.max_ongoing_requests, two.user_config) == (
        "examples.echo:Echo",
        4,
        {"threshold": 0.5, "labels": ["a", "b"]},
    )
    assert two.init_args == [["a", "b"], ["a", "b"]] and two.init_kwargs == {"config": one.user_config}


def test_a_top_level_x_key_holds_an_anchor_and_is_no_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
x-base: &base {import_path: examples.echo:Echo, max_ongoing_requests: 4}
deployments:
  - {<<: *base, name: one}
  - {<<: *base, name: two}
""",
    )
    assert [(d.name, d.max_ongoing_requests) for d in load_config(path, LIMITS).deployments] == [("one", 4), ("two", 4)]
    with pytest.raises(ConfigError, match="y-base: unknown field"):
        load_config(write(tmp_path, "y-base: 1\ndeployments: []\n"), LIMITS)


def test_a_mapping_given_a_scalar_is_told_to_be_one_without_naming_our_classes(tmp_path: Path) -> None:
    text = "deployments:\n  - {name: one, import_path: examples.echo:Echo, response_cache: true}\n"
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, text), LIMITS)
    assert str(refused.value).endswith("deployment 'one' (deployments[0]): response_cache: Input should be a mapping")


def test_a_file_without_aliases_is_not_measured_against_the_limit(tmp_path: Path) -> None:
    """What aliases add is bounded, not the file: each deployment is still held to config_bytes as before."""
    deployments = "".join(
        f"  - {{name: d{i}, import_path: 'examples.echo:Echo', user_config: {'y' * 5_000}}}\n" for i in range(4)
    )
    assert len(load_config(write(tmp_path, f"deployments:\n{deployments}"), LIMITS).deployments) == 4


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path, "deployments:\n  - name: loop\n    import_path: examples.echo:Echo\n    user_config: &l [*l]\n"
    )
    with pytest.raises(
        ConfigError, match=r"line 4, column 18: not valid YAML: an alias stands for a value it is inside"
    ):
        load_config(path, LIMITS)
