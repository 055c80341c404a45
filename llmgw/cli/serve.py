"""``llmgw serve``: the control API, the gateway and the scheduler, in one process or several."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import sys

import click

from llmgw.cli.output import failures


@click.command()
@click.option("--config", "-c", "config_path", required=True,
              type=click.Path(dir_okay=False), help="The server's configuration (server.yaml).")
@click.option("--listen", default=None, help="HOST:PORT, overriding the file's listen.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Gateway processes sharing the port. Above 1, this process runs the "
                   "scheduler and the control API, and the workers the gateway.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
def serve(config_path: str, listen: str | None, workers: int, log_level: str) -> None:
    """Run the control API, the OpenAI-compatible gateway and the scheduler.

    The configuration is read and validated completely before anything binds
    a port; an error names the file and the key to fix.

    With --workers N, N gateway processes accept on the port (one per core is
    the rule of thumb; each runs the whole gateway), while this process runs
    the scheduler, its engines and the control API, and restarts a worker
    that dies.
    """
    import msgspec
    import uvicorn

    from llmgw.config import load_config, split_listen
    from llmgw.connection import uvicorn_options
    from llmgw.server import Server

    logging.basicConfig(
        level=getattr(logging, log_level.upper()), stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    with failures():
        cfg = load_config(config_path)
        if listen:
            cfg = msgspec.structs.replace(cfg, listen=listen)
        host, port = split_listen(cfg.listen)
        # The embedded scheduler reports each replica loading, ready, failing
        # and stopping; a person watching `serve` wants exactly those lines.
        server = Server(cfg, config_name=config_path, control_only=workers > 1,
                        on_event=lambda event: click.echo(event.line(), err=True))
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host

    if workers == 1:
        async def announce() -> None:
            click.echo(f"llmgw listening on http://{shown}:{port}  "
                       f"(gateway /v1, control API /api/v1, metrics /metrics)", err=True)

        server.api.on_startup.append(announce)
        # A bound method is not recognised as ASGI 3 by uvicorn's sniffing.
        uvicorn.run(server.asgi, host=host, port=port, lifespan="on", log_level=log_level,
                    access_log=False, timeout_graceful_shutdown=30, interface="asgi3",
                    **uvicorn_options(cfg.gateway))
        return
    _serve_with_workers(server, cfg.listen, config_path, listen, workers, log_level, shown,
                        port)


def _serve_with_workers(server: object, listen_addr: str, config_path: str, listen: str | None,
                        workers: int, log_level: str, shown: str, port: int) -> None:
    import uvicorn

    from llmgw.server import Server
    from llmgw.workers import WorkerArgs, Workers, bind, control_paths

    assert isinstance(server, Server)
    with failures():
        try:
            sock = bind(listen_addr)
        except OSError as exc:
            from llmgw.errors import ConfigError

            raise ConfigError(f"listen: cannot bind {listen_addr}: {exc.strerror}; choose "
                              "another port or stop what holds it", field="listen") from None
    directory, control = control_paths()
    control_server = uvicorn.Server(uvicorn.Config(
        server.asgi, uds=control, lifespan="on", log_level=log_level, access_log=False,
        timeout_graceful_shutdown=30, interface="asgi3"))
    pool = Workers(workers, WorkerArgs(config_path=config_path, listen=listen,
                                       control_socket=control, log_level=log_level),
                   sock, stopping=lambda: control_server.should_exit)

    async def supervise() -> None:
        await pool.run()
        await pool.stop()

    def stop(*_: object) -> None:
        control_server.should_exit = True

    async def main() -> None:
        # uvicorn puts back the handlers it found and raises a caught signal
        # again once its server has shut down: with the default handlers that
        # second delivery would end this process before it stops the workers.
        # With these it only asks for the stop already under way.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)
        serving = asyncio.create_task(control_server.serve())
        while not control_server.started:
            if serving.done():
                await serving
                return
            await asyncio.sleep(0.05)
        supervising = asyncio.create_task(supervise())
        click.echo(f"llmgw listening on http://{shown}:{port} with {workers} gateway workers "
                   f"(gateway /v1, control API /api/v1, metrics /metrics)", err=True)
        try:
            await serving
        finally:
            # The workers stop as soon as the control server begins to (the
            # supervisor returns then), not after it: until they hang up, the
            # server's shutdown waits on their long polls of the relay.
            if not control_server.should_exit:
                supervising.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervising
            await pool.stop()
            sock.close()
            shutil.rmtree(directory, ignore_errors=True)

    asyncio.run(main())
