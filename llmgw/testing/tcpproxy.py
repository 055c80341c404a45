"""A TCP proxy on loopback that can freeze and cut what it carries: a store that goes away.

A database that stops answering is not one that refuses connections: its
connections stay open, the kernel acknowledges every byte sent to them, and
nothing comes back. ``freeze`` does that — every connection is held open
and no byte is passed on in either direction, new connections are accepted
and held too (or refused, ``refuse_new``) — until ``resume``, which passes on
everything held, in order.
``cut`` closes every connection (and ``refuse`` makes new ones close at once
until ``resume``): a restart or a partition that resets.

    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()          # proxy.port: where clients connect
    proxy.freeze(); ...; proxy.resume()

``python -m llmgw.testing.tcpproxy --target 127.0.0.1:5432 --port 15432``
runs one on its own, frozen and resumed by SIGUSR1 and SIGUSR2 (SIGHUP: cut).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536


def through(url: str, port: int) -> str:
    """``url`` (a database's) with its host and port replaced by a proxy's on loopback
    at ``port``, its credentials, path and query kept."""
    parts = urlsplit(url)
    creds, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{creds}{at}127.0.0.1:{port}"))


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[object]] = set()
        self.connections = 0

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self, *, refuse_new: bool = False) -> None:
        """Pass nothing on, in either direction, and hold every connection open;
        ``refuse_new``: close new connections at once instead of holding them (a client's
        side-channel, such as Postgres's cancel request, then fails fast)."""
        self._refusing = refuse_new
        self._flowing.clear()

    def resume(self) -> None:
        """Pass on what was held, and everything after; accept connections again."""
        self._refusing = False
        self._flowing.set()

    def cut(self, *, refuse: bool = False) -> None:
        """Close every connection now; ``refuse``: close new ones too, until ``resume``."""
        self._refusing = refuse
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        self._flowing.set()
        for task in list(self._tasks):
            task.cancel()
        # The connections' own tasks end by themselves once their pipes are gone (one
        # cancelled instead would be logged as an error by asyncio's stream protocol).
        await asyncio.gather(*self._tasks, *self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._connect(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._writers.discard(writer)
            writer.transport.abort()
            return
        if writer not in self._writers:     # cut while it connected
            up_writer.transport.abort()
            return
        self.connections += 1
        self._writers.add(up_writer)
        pipes = [asyncio.create_task(self._pipe(reader, up_writer)),
                 asyncio.create_task(self._pipe(up_reader, writer))]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._tasks.difference_update(pipes)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                # Read while frozen, passed on after: the sender sees its bytes taken,
                # as from a peer that stopped answering.
                await self._flowing.wait()
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()


async def _main(args: argparse.Namespace) -> None:
    host, _, port = args.target.rpartition(":")
    proxy = TcpProxy(host, int(port), port=args.port)
    await proxy.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, proxy.freeze)
    loop.add_signal_handler(signal.SIGUSR2, proxy.resume)
    loop.add_signal_handler(signal.SIGHUP, proxy.cut)
    print(f"127.0.0.1:{proxy.port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await proxy.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="host:port to forward to")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(_main(parser.parse_args()))
