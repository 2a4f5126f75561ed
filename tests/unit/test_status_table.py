"""The status table's lines about a deployment stay short however many names Redis lists for it."""

from __future__ import annotations

from streamserve.cli.tables import NAMES_SHOWN, format_status
from streamserve.control.status import DeploymentStatus


def metered(limited: list[str]) -> DeploymentStatus:
    return DeploymentStatus(
        name="metered",
        route_prefix="/metered",
        version="v1",
        health="HEALTHY",
        message="",
        target=1,
        running=1,
        starting=0,
        stopping=0,
        queued=0,
        in_flight=0,
        dead_letters=0,
        limited_tenants=limited,
    )


def test_the_limited_tenants_line_names_the_first_few_and_counts_the_rest() -> None:
    tenants = [f"t{i}" for i in range(250)]
    [line] = [ln for ln in format_status([metered(tenants)]).splitlines() if "over their limits" in ln]
    shown = ", ".join(tenants[:NAMES_SHOWN])
    assert line == f"metered: tenants over their limits in the last minute: {shown} and 240 more (status --json)"


def test_a_few_limited_tenants_are_all_named() -> None:
    out = format_status([metered(["acme", "globex"])])
    assert "metered: tenants over their limits in the last minute: acme, globex" in out.splitlines()
