"""The gateway's OpenAPI document: what its ``/-/`` routes answer, errors included, so that it is true.

Every error is ``{"error", "message"}`` (``request_id`` too where one applies) with the status of the
one table in ``errors.py``. FastAPI's own 422 for a bad parameter never happens here: such errors
are 400 (``handle_request_validation_error``), so the document says 400 instead.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from streamserve.app.errors import STATUS_BY_ERROR

ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "the error's type, e.g. NotFoundError"},
        "message": {"type": "string"},
        "request_id": {"type": "string"},
    },
}

# Every status an error can have; any route may answer any of them (Redis down, a full Redis, a bad header...).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": "an error", "content": {"application/json": {"schema": ERROR_BODY}}}
    for status in sorted({status for _error, status in STATUS_BY_ERROR} | {408, 431})
}


def openapi_document(api: FastAPI) -> dict[str, Any]:
    """FastAPI's document for ``api`` without its 422 responses (built once, then cached on the app)."""
    if api.openapi_schema is None:
        document = FastAPI.openapi(api)  # FastAPI's own, which caches it on the app
        for item in document.get("paths", {}).values():
            for operation in item.values():
                operation.get("responses", {}).pop("422", None)
        return document
    return api.openapi_schema


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its JSON body itself (under the size and time limits)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


DEPLOY_BODY = json_body(
    {
        "type": "object",
        "required": ["deployments"],
        "properties": {
            "deployments": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "import_path"],
                    "properties": {
                        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"},
                        "import_path": {
                            "type": "string",
                            "pattern": "^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                        },
                        "num_replicas": {"type": "integer", "minimum": 0, "maximum": 64},
                    },
                },
            },
            "endpoints": {"type": "array", "items": {"type": "object"}},
        },
    }
)
SCALE_BODY = json_body(
    {
        "type": "object",
        "required": ["num_replicas"],
        "properties": {"num_replicas": {"type": "integer", "minimum": 0}},
        "additionalProperties": False,
    }
)
TRAFFIC_BODY = json_body(
    {
        "type": "object",
        "required": ["traffic"],
        "properties": {
            "traffic": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
            "shadow": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1}},
        },
        "additionalProperties": False,
    }
)


# Swagger UI, at one version: FastAPI's page loads whatever 5.x the CDN has now, into the origin that admin writes
# are taken from.
SWAGGER_UI = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.17.14"
DOCS_PATH = "/-/docs"
OPENAPI_PATH = "/-/openapi.json"


def add_docs_page(api: FastAPI) -> None:
    """Swagger UI at DOCS_PATH, and no other page: FastAPI's own ReDoc (``/redoc``) and OAuth2 redirect
    (``/docs/oauth2-redirect``) pages were served outside the gateway's ``/-/`` and shadowed deployment routes."""

    @api.get(DOCS_PATH, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_PATH,
            title=f"{api.title} - API",
            swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css",
        )
