"""Keep the garbage collector off what a long-running process loaded at start-up."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, the user's model) out of the collector's reach.

    CPython's full collections walk every tracked object. A serving process
    allocates many short-lived ones per request, and each full collection
    walked the whole start-up heap too: a deployment with a large model paid
    for its weights' object graph again and again. Frozen objects are still
    freed when their last reference goes; only a cycle among them lingers,
    which start-up objects, alive for the whole process, never need.
    """
    gc.collect()
    gc.freeze()
