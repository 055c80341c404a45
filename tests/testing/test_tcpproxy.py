"""The freezing TCP proxy the ledger's outage tests and benchmark put in front of Postgres."""

from __future__ import annotations

import asyncio
import contextlib

from llmgw.testing.tcpproxy import TcpProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    writer.close()


async def test_a_frozen_proxy_holds_bytes_and_connections_until_it_resumes() -> None:
    """Frozen: the connection stays open and nothing comes back; resumed: all of it does,
    in order; cut: the connection ends, and while refusing, new ones end at once."""
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"before ")
        assert await asyncio.wait_for(reader.readexactly(7), 30) == b"before "
        proxy.freeze()
        writer.write(b"during ")
        await writer.drain()
        # Held, not lost and not refused: the read sees nothing while frozen.
        read = asyncio.create_task(reader.readexactly(7))
        done, _ = await asyncio.wait([read], timeout=0.3)
        assert not done
        proxy.resume()
        assert await asyncio.wait_for(read, 30) == b"during "
        proxy.cut(refuse=True)
        assert await asyncio.wait_for(reader.read(), 30) == b""
        refused_reader, refused = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(refused_reader.read(), 30) == b""
        refused.close()
        writer.close()
        proxy.resume()
        again_reader, again = await asyncio.open_connection("127.0.0.1", proxy.port)
        again.write(b"after")
        assert await asyncio.wait_for(again_reader.readexactly(5), 30) == b"after"
        again.close()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()
