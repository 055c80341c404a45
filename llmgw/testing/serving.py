"""Serve an ASGI app with uvicorn on loopback for a test or a bench: ``serve(app)``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

# Generous: a loaded two-core machine may take seconds to bind.
START_WAIT = 60.0


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1 at a free port until the block ends; yields its base
    URL. Fails with uvicorn's own error when it stops before it listens, and after
    ``START_WAIT`` seconds when it never does."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                           log_level="warning", interface="asgi3",
                                           access_log=False))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(START_WAIT):
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn sets a flag)
            await asyncio.sleep(0.02)
    if task.done():
        task.result()
        raise AssertionError("uvicorn stopped before it listened")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
