"""What the import allow-list's tests resolve: objects this module defines, and objects it merely imported.

Under ``STREAMSERVE_IMPORT_ALLOW=tests.allow_list_targets`` the first kind loads and the second is refused
(tests/unit/test_import_resolution.py).
"""

from __future__ import annotations

import functools
import os
from builtins import print  # reachable as tests.allow_list_targets:print, as any module may make it
from os import system
from typing import Any

__all__ = ["Model", "handler", "model", "no_body", "os", "print", "run_true", "system", "table", "with_db_handler"]


class Model:
    """A class defined here, with a class nested in it."""

    class Options:
        """A class nested in an allowed class."""

        def __init__(self, body: Any = None) -> None:
            self.body = body

    def __call__(self, body: Any) -> Any:
        return body

    def predict(self, body: Any) -> Any:
        return body

    @staticmethod
    def helper(body: Any) -> Any:
        return body


def handler(body: Any) -> Any:
    return body


model = Model()  # an instance of a class defined here


def no_body() -> None:
    """A function a request's body cannot be given to."""


def with_db(fn: Any) -> Any:
    """A decorator that hands its function a second argument: the wrapper takes the body alone."""

    @functools.wraps(fn)
    def wrapper(body: Any) -> Any:
        return fn(body, "db")

    return wrapper


@with_db
def with_db_handler(body: Any, db: str) -> Any:
    return [body, db]


table = {"handler": handler}  # an instance of a built-in type
run_true = functools.partial(system, "true")  # an instance of functools.partial, wrapping os.system
