"""The documentation holds together: the MkDocs site builds with --strict, and the README's links lead somewhere.

mkdocs.yml turns a broken link, a missing anchor or a page left out of the navigation into a warning, and
``--strict`` makes every warning fail the build. The README is read on GitHub, outside the site, so its relative
links are checked here against the tree.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

from streamserve.wire.states import REPLICA_TRANSITIONS

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


def readme_links() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return [target for target in MARKDOWN_LINK.findall(readme) if not re.match(r"[a-z][a-z0-9+.-]*:|#", target)]


def test_every_relative_link_in_the_readme_points_to_a_file() -> None:
    links = readme_links()
    assert links, "the README links into docs/"
    missing = [link for link in links if not (ROOT / link.split("#", 1)[0]).is_file()]
    assert missing == []


def test_the_readme_links_every_page_of_the_site() -> None:
    linked = {link.split("#", 1)[0] for link in readme_links()}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set()


def test_the_lifecycle_table_is_the_code() -> None:
    """Architecture's table of replica transitions lists exactly the moves REPLICA_TRANSITIONS allows."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = set(re.findall(r"^\| `([A-Z_]+)` \| `([A-Z_]+)` \|", page, re.M))
    allowed = {(old.value, new.value) for old, moves in REPLICA_TRANSITIONS.items() for new in moves}
    assert rows == allowed


def test_the_streaming_example_in_the_api_page_is_the_examples_code() -> None:
    """docs/api.md shows examples/tokens.py's generate as it is (the page's copy once required a "text" the example
    does not, and slept before the first token)."""
    source = (ROOT / "examples" / "tokens.py").read_text()
    shown = re.search(r"```python\n(async def generate\(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)
    assert shown is not None, "docs/api.md shows no generate"
    assert shown.group(1) in source


def test_every_example_the_docs_name_exists() -> None:
    """Each `examples.MODULE:NAME` the README and the docs name can be imported (tenants.md once deployed
    examples.functions:echo, which is no function there: its replicas could not start)."""
    named = set()
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        named |= set(re.findall(r"\b(examples(?:\.[a-z_]+)+):([A-Za-z_]\w*)", page.read_text()))
    assert named, "the docs name no example"
    missing = [
        f"{module}:{name}" for module, name in sorted(named) if not hasattr(importlib.import_module(module), name)
    ]
    assert missing == []
