"""``call``: one request to a deployment or endpoint through the Python client, its JSON result printed."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import BadRequestError


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    try:
        body = orjson.loads(args.body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"body is not valid JSON: {exc}") from None

    async def call() -> Any:
        async with AsyncClient(settings=settings) as client:
            return await client.call(args.name, body, timeout=args.timeout, method=args.method)

    result = asyncio.run(call())
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0
