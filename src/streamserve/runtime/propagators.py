"""The trace propagators a process is told to use (``OTEL_PROPAGATORS``), kept to those installed here."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from importlib.metadata import entry_points


def drop_missing_propagators(environ: MutableMapping[str, str] = os.environ) -> str:
    """Take out of ``OTEL_PROPAGATORS`` the propagators not installed here, and say which ("" when all are).

    OpenTelemetry raises at import for one it cannot find, and FastAPI imports it: a farm-wide ``b3`` without its
    package kept the gateway from starting, traced or not. Called before a role's modules are imported."""
    given = environ.get("OTEL_PROPAGATORS", "")
    names = [name.strip() for name in given.split(",") if name.strip()]
    missing = [n for n in names if n.lower() != "none" and not entry_points(group="opentelemetry_propagator", name=n)]
    if not missing:
        return ""
    kept = [name for name in names if name not in missing]
    if kept:
        environ["OTEL_PROPAGATORS"] = ",".join(kept)
    else:
        del environ["OTEL_PROPAGATORS"]  # OpenTelemetry's default then: tracecontext,baggage
    packages = sorted({_PACKAGES.get(name.lower(), f"opentelemetry-propagator-{name.lower()}") for name in missing})
    return (
        f"OTEL_PROPAGATORS names {', '.join(missing)}, not installed here (pip install {' '.join(packages)}); "
        f"propagating with {', '.join(kept) or 'tracecontext, baggage'} instead"
    )


# The package of a propagator whose name is not its package's.
_PACKAGES = {"b3multi": "opentelemetry-propagator-b3", "xray": "opentelemetry-propagator-aws-xray"}
