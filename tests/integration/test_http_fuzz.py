"""Schema-driven fuzzing of the gateway's own API (Schemathesis), in process over ASGI, with and without a key.

Every operation the OpenAPI document declares gets a bounded number of generated requests, valid and
not. No answer may be a 5xx, and none may contradict the document: its status codes, content types,
bodies and headers (an ``Allow`` on a 405 included).
"""

from __future__ import annotations

from collections import Counter

import hypothesis
import pytest
import schemathesis
from pydantic import SecretStr
from schemathesis import checks

from streamserve.app.gateway import create_app
from streamserve.runtime.settings import Settings

EXAMPLES_PER_OPERATION = 25
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.allow_header_conformance,
]


# Schemathesis's own strategies draw from the `random` module, which Hypothesis deprecates; nothing of ours does.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies:FutureWarning")
@pytest.mark.parametrize("key", [None, "fuzz-key"], ids=["no-key", "with-key"])
def test_the_gateway_api_keeps_its_document_under_fuzzing(redis_url: str, key: str | None) -> None:
    settings = Settings(redis_url=redis_url, api_key=SecretStr(key) if key else None)
    schema = schemathesis.openapi.from_asgi("/-/openapi.json", create_app(settings))
    # The gateway's own Host (admin writes refuse others: app/admin_guard.py), and the key when there is one.
    headers = {"Host": "localhost", **({"Authorization": f"Bearer {key}"} if key else {})}
    statuses: Counter[int] = Counter()
    writes: Counter[int] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        def fuzz(case: schemathesis.Case) -> None:
            status = case.call_and_validate(headers=headers, checks=CHECKS).status_code
            statuses[status] += 1
            if case.method in ("POST", "DELETE"):
                writes[status] += 1

        fuzz()
    # The fuzzing reached the handlers (Redis answered, writes went through) rather than bouncing off one error.
    assert statuses[200] > 0 and statuses[400] > 0, statuses
    # With the key, writes get past the guard (some are done, some refused by the write itself); without, none is.
    assert (writes[200] > 0 and writes[400] > 0) if key else set(writes) == {403}, writes
