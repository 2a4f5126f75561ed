"""``call``: one request to a deployment or endpoint through the Python client, its JSON result printed.

A streaming deployment's chunks are printed as they come, one JSON value per line (a unary deployment's result is
its one line). Ctrl-C cancels the request: the call's task is cancelled, so that leaving the stream sends the
cancel and closing the client waits for it to go out (the CLI's own Ctrl-C handler would exit before); a second
Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading

import orjson

from streamserve.cli.interrupt import exit_interrupted
from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire import json_values


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    raw = args.body.encode(errors="surrogateescape")  # (bytes the shell gave that are not UTF-8 are named)
    try:
        body = orjson.loads(raw)
        json_values.check_decoded(raw, body)  # as the gateway reads a body: never a value changed on its way
    except orjson.JSONDecodeError as exc:
        print(f"error: the body is {json_values.decode_error(raw, exc)}", file=sys.stderr)
        return 2  # bad usage, as a bad config is
    except ValueError as exc:
        print(f"error: the body: {exc}", file=sys.stderr)
        return 2

    async def call() -> None:
        # (Its Redis named: the command looked for a farm already, and says in its own terms how to name another.)
        async with AsyncClient(settings.effective_redis_url, settings=settings) as client:
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

    async def until_done_or_interrupted() -> int:
        task = asyncio.ensure_future(call())
        interrupted = False

        def interrupt() -> None:
            nonlocal interrupted
            if interrupted:
                exit_interrupted()
            interrupted = True
            task.cancel()

        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            await task
        except asyncio.CancelledError:
            if not interrupted:
                raise
            print("interrupted", file=sys.stderr, flush=True)
            return 130
        return 0

    return asyncio.run(until_done_or_interrupted())
