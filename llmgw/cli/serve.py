"""``llmgw serve``: the control API, the gateway and the scheduler in one process."""

from __future__ import annotations

import logging
import sys

import click

from llmgw.cli.output import failures


@click.command()
@click.option("--config", "-c", "config_path", required=True,
              type=click.Path(dir_okay=False), help="The server's configuration (server.yaml).")
@click.option("--listen", default=None, help="HOST:PORT, overriding the file's listen.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
def serve(config_path: str, listen: str | None, log_level: str) -> None:
    """Run the control API, the OpenAI-compatible gateway and the scheduler.

    The configuration is read and validated completely before anything binds
    a port; an error names the file and the key to fix.
    """
    import msgspec
    import uvicorn

    from llmgw.config import load_config, split_listen
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
        server = Server(cfg, config_name=config_path,
                        on_event=lambda event: click.echo(event.line(), err=True))

    async def announce() -> None:
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        click.echo(f"llmgw listening on http://{shown}:{port}  "
                   f"(gateway /v1, control API /api/v1, metrics /metrics)", err=True)

    server.api.on_startup.append(announce)
    # A bound method is not recognised as ASGI 3 by uvicorn's sniffing.
    uvicorn.run(server.asgi, host=host, port=port, lifespan="on", log_level=log_level,
                access_log=False, timeout_graceful_shutdown=30, interface="asgi3")
