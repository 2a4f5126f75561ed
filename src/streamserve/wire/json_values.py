"""User values as JSON, exactly or not at all: what JSON cannot hold is refused, never changed.

orjson writes NaN and Infinity as ``null`` and reads integers beyond 64 bits
as floats, and it encodes at most 254 levels of nesting while it decodes
1,024. Each of those would change a caller's data or fail only after the
handler ran, so they are refused where the value enters: 400 at the gateway,
BadRequestError in the client, a 500 that says why for a handler's result.
The checks cost a substring or byte count on the hot path; the check of the
whole value runs only when that first look finds a candidate.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import re
from typing import Any

import orjson

MAX_DEPTH = 254  # the deepest nesting orjson.dumps encodes; deeper values could never be answered
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # what orjson carries as integers
# A body with each digit as 9, each minus sign kept and every other byte a space (bytes.translate: C speed, where a
# regular expression takes a step per byte): a number that may not fit in 64 bits, or digits in a string, shows as
# 20 nines, or a minus and 19 (every positive number of 19 digits fits).
_DIGITS_AND_MINUS = bytes(b if b in b"0123456789-" else 32 for b in range(256)).translate(
    bytes.maketrans(b"0123456789", b"9999999999")
)
_LONG_POSITIVE, _LONG_NEGATIVE = b"9" * 20, b"-" + b"9" * 19
_NINETEEN_DIGITS = re.compile(rb"\d{19}")  # the first look, cheaper than the translation for a small body
# A body at least this long is read with the garbage collector paused (check_body).
_GC_PAUSE_BYTES = 64 * 1024


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
    said = str(error)
    if said.startswith(_TOO_LARGE_FOR_A_DOUBLE):  # valid JSON, but no number this side carries
        where = said.removeprefix(_TOO_LARGE_FOR_A_DOUBLE).lstrip(": ")
        return (
            f"JSON with a number too large to carry ({where}): integers are carried exactly within 64 bits,"
            " other numbers as doubles; send a larger one as a string"
        )
    return f"not valid JSON: {error}"


# orjson's words for a number beyond a double's range (1e400, or an integer of hundreds of digits).
_TOO_LARGE_FOR_A_DOUBLE = "number is infinity when parsed as double"


def check_body(body: bytes) -> None:
    """orjson.JSONDecodeError unless ``body`` is JSON, ValueError unless orjson reads it exactly (check_decoded), for
    a caller that only forwards the body. The value read is dropped before the garbage collector may look at it:
    traversing the millions of containers a large body can hold took it seconds, and ran again and again while the
    value lived."""
    if len(body) < _GC_PAUSE_BYTES or not gc.isenabled():
        check_decoded(body, orjson.loads(body))
        return
    gc.disable()
    try:
        check_decoded(body, orjson.loads(body))
    finally:
        gc.enable()


def check_decoded(body: bytes, value: Any) -> None:
    """For a body orjson.loads read as ``value``: ValueError unless ``value`` is exactly what the body says.

    Neither check walks the value in Python (that held a gateway's event loop for seconds on a few megabytes of
    ``[[],[],...]``): the depth is checked by orjson encoding the value; only a body with a run of digits that may not
    fit in 64 bits (it may be in a string) is read again by the standard library's parser, which hands each integer's
    digits to ``_exact_int`` (with the depth checked first, it cannot recurse too deep)."""
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH:
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:  # a decoded value fails to encode for its depth alone
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _NINETEEN_DIGITS.search(body) and _may_not_fit(body.translate(_DIGITS_AND_MINUS)):
        try:
            json.loads(body, parse_int=_exact_int)
        except _InexactInteger:
            raise ValueError(
                f"an integer outside [{_INT64_MIN}, {_UINT64_MAX}] cannot be carried exactly; send it as a string"
            ) from None


def check_unique_keys(body: bytes) -> None:
    """ValueError when an object in ``body`` (JSON) gives a key twice: a config's JSON is read as strictly as its
    YAML (wire/yaml_text.py), where JSON parsers keep the last value and drop the first without a word. Read by the
    standard library's parser, which hands each object's pairs over in order: for admin writes, off the hot path."""
    json.loads(body, object_pairs_hook=_unique_pairs)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"{key!r} is given twice in one object")
        found[key] = value
    return found


def _may_not_fit(digits: bytes) -> bool:
    return _LONG_POSITIVE in digits or _LONG_NEGATIVE in digits


class _InexactInteger(Exception):
    """An integer orjson would have read as a float."""


_MAX_INT_DIGITS = len(str(_UINT64_MAX))


def _exact_int(digits: str) -> int:
    if len(digits) > _MAX_INT_DIGITS + 1:  # int() of thousands of digits raises, and takes its time before that
        raise _InexactInteger
    number = int(digits)
    if not _INT64_MIN <= number <= _UINT64_MAX:
        raise _InexactInteger
    return number


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list | tuple):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    return []


def config_value_problem(value: Any) -> str | None:
    """What in a config's value (init_args, init_kwargs, user_config: what YAML or JSON made) JSON would not keep as
    given, None when nothing: NaN or an infinity (stored as null), or a key that is no string (YAML's ``5:``, ``true:``
    or ``2020-01-01:``, stored as some text of it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{item} has no JSON form (it would be stored as null)"
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return f"the key {key!r} is not a string, as a JSON object's keys are (quote it)"
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


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
