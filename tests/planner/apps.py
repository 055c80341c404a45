"""The plan route in a Litestar app of its own, as the lead mounts it: under /api/v1,
with the project's error mapping and an AppContext whose backend reports a fleet."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from litestar import Litestar, Router
from litestar.di import Provide

from llmgw.api import plan as plan_api
from llmgw.api.errors import exception_handlers
from llmgw.config import ServerConfig
from llmgw.control.context import AppContext
from llmgw.scheduler.base import Fleet, NodeView, Pool

GiB = 1024**3
H100 = 81559 * 1024**2


class FleetBackend:
    """A backend that knows only its fleet; the plan route asks nothing else."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self.calls = 0

    async def fleet(self) -> Fleet:
        self.calls += 1
        return self._fleet


def node_8x_h100_80g(name: str, fabric: str) -> NodeView:
    return NodeView(name=name, id=name, status="ready", schedulable=True, gpu_class="h100-80g",
                    gpu_device="NVIDIA H100 80GB HBM3", fabric=fabric, gpus_total=8,
                    gpus_free=8, gpu_memory=H100, cores_total=96, cores_free=96,
                    memory_total=1024 * GiB, memory_free=1024 * GiB)


def two_fabric_fleet() -> Fleet:
    nodes = [node_8x_h100_80g("gpu-a1", "ib-a"), node_8x_h100_80g("gpu-b1", "ib-b")]
    pools = [Pool(name=f"h100-80g/{f}", gpu_class="h100-80g", fabric=f, gpu_memory=H100,
                  nodes=[n], gpus_total=8, gpus_free=8, largest_free_gpus_on_a_node=8)
             for f, n in (("ib-a", "gpu-a1"), ("ib-b", "gpu-b1"))]
    return Fleet(nodes=nodes, pools=pools)


def plan_app(backend: Any) -> Litestar:
    ctx = AppContext(config=ServerConfig(), models=None, backend=backend,  # type: ignore[arg-type]
                     store=None)  # type: ignore[arg-type]
    api = Router("/api/v1", route_handlers=plan_api.route_handlers)
    return Litestar(route_handlers=[api], exception_handlers=exception_handlers,
                    dependencies={"ctx": Provide(lambda: ctx, sync_to_thread=False)})


@contextmanager
def serving(app: Litestar) -> Iterator[str]:
    """Serve ``app`` on a loopback port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the test API server did not start within 30 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
