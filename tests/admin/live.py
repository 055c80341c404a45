"""The real app served over loopback by uvicorn in a thread, for the browser to reach."""

from __future__ import annotations

import threading
import time

import uvicorn
from litestar import Litestar

DEADLINE = 30.0


class LiveServer:
    """uvicorn on 127.0.0.1 with a port the OS picks; the app's startup runs in its loop."""

    def __init__(self, app: Litestar) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on",
                                log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="admin-live-server",
                                       daemon=True)
        self.url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + DEADLINE
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the live server stopped during start-up; see its log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the live server did not start within {DEADLINE:.0f} s")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(DEADLINE)
