"""User values as JSON, exactly or not at all: what JSON cannot hold is refused, never changed.

orjson writes NaN and Infinity as ``null`` and reads integers beyond 64 bits
as floats, and it encodes at most 254 levels of nesting while it decodes
1,024. Each of those would change a caller's data or fail only after the
handler ran, so they are refused where the value enters: 400 at the gateway,
BadRequestError in the client, a 500 that says why for a handler's result.
The checks cost a substring or byte count on the hot path; the walk over the
value runs only when that first look finds a candidate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import orjson

MAX_DEPTH = 254  # the deepest nesting orjson.dumps encodes; deeper values could never be answered
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # what orjson carries as integers
_LONG_DIGITS = re.compile(rb"\d{19}")  # a number this long may be beyond 64 bits


def dumps(value: Any) -> bytes:
    """JSON for a user value (numpy arrays and dataclasses too).

    ValueError for NaN or an infinity anywhere in it, TypeError (orjson's) for what JSON has no form for.
    """
    encoded = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" in encoded and _has_non_finite(value):
        raise ValueError("NaN and Infinity have no JSON form (they would arrive as null)")
    return encoded


def decode_error(body: bytes, error: orjson.JSONDecodeError) -> str:
    """Why ``body`` is no JSON, as an error message says it: orjson's words, or, for bytes that are not UTF-8 (which
    orjson calls "str is not valid UTF-8: surrogates not allowed"), where the first bad byte is."""
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (JSON text is): byte 0x{body[exc.start]:02x} at offset {exc.start}"
    return f"not valid JSON: {error}"


def check_decoded(body: bytes, value: Any) -> None:
    """For a body orjson.loads read as ``value``: ValueError unless ``value`` is exactly what the body says."""
    if _LONG_DIGITS.search(body) and _has_big_int(json.loads(body)):
        raise ValueError(
            f"an integer outside [{_INT64_MIN}, {_UINT64_MAX}] cannot be carried exactly; send it as a string"
        )
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list | tuple):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    return []


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif getattr(item, "dtype", None) is not None and item.dtype.kind in "fc":  # numpy arrays and scalars
            import numpy

            if not numpy.isfinite(item).all():
                return True
        else:
            stack.extend(_children(item))
    return False


def _has_big_int(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and not _INT64_MIN <= item <= _UINT64_MAX:
            return True
        stack.extend(_children(item))
    return False


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in _children(item))
    return deepest
