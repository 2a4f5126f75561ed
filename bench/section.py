"""One bench's part of RESULTS.md, and the markdown pieces it is made of: tables and verdicts on targets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    """One bench's part of RESULTS.md: a heading, what was run, tables, and the verdicts on its targets."""

    key: str
    title: str
    setup: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    # Nothing was measured (e.g. an optional extra is missing): RESULTS.md keeps this section from an earlier run.
    skipped: bool = False

    def markdown(self) -> str:
        lines = [f"## {self.title}", ""]
        if self.setup:
            lines += [*[f"- {s}" for s in self.setup], ""]
        lines += self.body
        if self.body and self.body[-1] != "":
            lines.append("")
        if self.verdicts:
            lines += [*[f"- {v}" for v in self.verdicts], ""]
        return "\n".join(lines)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> list[str]:
    """A markdown table; ``align`` is one letter per column, l or r (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---" if a == "l" else "---:" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")
