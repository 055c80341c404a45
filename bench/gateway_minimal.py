"""Minimal pass-through proxies, one per HTTP client, to compare the clients' own cost.

    LLMGW_BENCH_UPSTREAM=http://127.0.0.1:PORT LLMGW_BENCH_CLIENT=aiohttp|httpx \\
        uvicorn --app-dir bench gateway_minimal:app

Each reads the body and POSTs it upstream over a pooled keep-alive
connection, then returns the answer: no keys, parsing, metrics or retries.
The difference between the two is what choosing the client costs;
``gateway_compare.py`` runs both next to the real gateway.
"""

from __future__ import annotations

import os
from typing import Any

UPSTREAM = os.environ.get("LLMGW_BENCH_UPSTREAM", "http://127.0.0.1:18081")
CLIENT = os.environ.get("LLMGW_BENCH_CLIENT", "aiohttp")
_client: Any = None


async def _read(receive: Any) -> bytes:
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _client
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = await _read(receive)
    url = UPSTREAM + scope["path"]
    headers = {"content-type": "application/json"}
    if CLIENT == "httpx":
        import httpx

        if _client is None:
            _client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None,
                                                            max_keepalive_connections=1000))
        response = await _client.post(url, content=body, headers=headers)
        status, data = response.status_code, response.content
    else:
        import aiohttp

        if _client is None:
            _client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                            auto_decompress=False)
        async with _client.post(url, data=body, headers=headers) as response:
            status, data = response.status, await response.read()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
