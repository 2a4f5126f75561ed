"""Every error streamserve exports goes through pickle whole (multiprocessing pools and ProcessPoolExecutor send a
worker's error to its parent that way)."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest

import streamserve.errors
from streamserve.errors import StreamServeError

# A value for each parameter an error's __init__ may take (a new parameter fails the test until it has one here).
SAMPLES: dict[str, Any] = {
    "message": "it broke",
    "error_type": "ValueError",
    "replica_id": "echo#1",
    "traceback": "Traceback (most recent call last): ...",
    "allow": ("GET", "HEAD"),
    "retry_after_s": 7.5,
}

ERRORS = sorted(
    (cls for name in streamserve.errors.__all__ if isinstance(cls := getattr(streamserve.errors, name), type)),
    key=lambda cls: cls.__name__,
)


def made(cls: type[StreamServeError]) -> StreamServeError:
    """An instance of ``cls`` with every argument its __init__ takes given (none left to its defaults)."""
    _self, *parameters = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):  # Exception's own __init__
        return cls(SAMPLES["message"])
    return cls(**{p.name: SAMPLES[p.name] for p in parameters})


def test_every_exported_error_is_a_stream_serve_error() -> None:
    assert all(issubclass(cls, StreamServeError) for cls in ERRORS)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("protocol", [0, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL])
def test_an_error_round_trips_through_pickle_with_its_message_and_attributes(
    cls: type[StreamServeError], protocol: int
) -> None:
    error = made(cls)
    error.add_note("a note added on the way")
    again = pickle.loads(pickle.dumps(error, protocol))
    assert type(again) is cls
    assert str(again) == str(error)
    assert again.args == error.args
    assert vars(again) == vars(error)
