"""``call``: one request to a deployment or endpoint through the Python client, its JSON result printed.

A streaming deployment's chunks are printed as they come, one JSON value per line (a unary deployment's result is
its one line); Ctrl-C cancels the request.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import BadRequestError


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    try:
        body = orjson.loads(args.body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"body is not valid JSON: {exc}") from None

    async def call() -> None:
        async with AsyncClient(settings=settings) as client:
            chunks = client.stream(
                args.name,
                body,
                timeout=args.timeout,
                method=args.method or None,
                priority=args.priority,
                tenant=args.tenant,
                model_id=args.model_id,
            )
            async with chunks:  # leaving it early (Ctrl-C) cancels the request
                async for chunk in chunks:
                    sys.stdout.write(orjson.dumps(chunk).decode() + "\n")
                    sys.stdout.flush()

    asyncio.run(call())
    return 0
