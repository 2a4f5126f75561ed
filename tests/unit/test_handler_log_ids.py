"""What a handler's own code logs names the request it serves, as the replica's records about it do (the JSON
format promises request_id wherever one applies)."""

from __future__ import annotations

import io
import logging

import orjson

from streamserve.runtime.logging_setup import HandlerRequestIds, TextFormatter, json_formatter
from streamserve.runtime.request_scope import RequestScope


def logged(formatter: logging.Formatter, *, inside: bool, **extra: str) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(HandlerRequestIds())
    user_code = logging.getLogger("users.model")
    user_code.addHandler(handler)
    user_code.propagate = False  # (restored below: the logger is the process's)
    try:
        if inside:
            RequestScope("req-42", 0).context().run(user_code.warning, "tokens left: %d", 3, extra=extra)
        else:
            user_code.warning("tokens left: %d", 3, extra=extra)
    finally:
        user_code.removeHandler(handler)
        user_code.propagate = True
    return out.getvalue()


def test_a_line_logged_inside_a_handler_names_its_request() -> None:
    assert logged(TextFormatter(), inside=True).rstrip().endswith("tokens left: 3 request_id=req-42")
    assert orjson.loads(logged(json_formatter("worker"), inside=True))["request_id"] == "req-42"


def test_a_line_logged_outside_any_handler_names_none_and_one_that_names_its_own_keeps_it() -> None:
    assert "request_id" not in logged(TextFormatter(), inside=False)
    assert logged(TextFormatter(), inside=True, request_id="own").rstrip().endswith("request_id=own")
