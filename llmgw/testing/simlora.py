"""LoRA adapters in the simulated engine, as vLLM serves them.

What is modelled, each from vLLM's own behaviour:

* **Registration.** ``POST /v1/load_lora_adapter`` with ``lora_name`` and
  ``lora_path`` loads an adapter and answers 200 with a plain-text success
  line; a name already loaded is 400 ``InvalidUserInput`` ("has already been
  loaded"), a path that holds no adapter is 404 ``NotFoundError``.
  ``POST /v1/unload_lora_adapter`` with ``lora_name`` answers 200, or 404
  ``NotFoundError`` ("cannot be found") for a name not loaded
  (vllm/entrypoints/openai/serving_models.py, ``OpenAIServingModels``).
  ``GET /v1/models`` lists each loaded adapter with ``root`` its path and
  ``parent`` the base's name. Both endpoints exist only when the server runs
  with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set (api_server.py); here, when
  ``lora_slots`` is above 0.
* **Memory.** Adapters live in a host-memory cache of ``lora_cpu_slots``
  (``--max-cpu-loras``), least recently used first out; at most
  ``lora_slots`` (``--max-loras``) distinct adapters run in one batch, and a
  request for a further adapter waits until one of them has no running
  request (vLLM's scheduler skips such requests and reports them in
  ``waiting_lora_adapters``). An adapter pushed out of the host cache stays
  registered and is read from disk again when next asked for (vLLM's
  ``LRUCacheWorkerLoRAManager``), which costs ``lora_load_time`` like the
  first load. ``disk_loads`` counts every such read: it is what a routing
  policy that thrashes pays.
* **Refusal.** A request naming neither the base nor a loaded adapter is 404
  ("The model `x` does not exist."), as vLLM answers.
* **The metric.** ``vllm:lora_requests_info``, a gauge whose value is the time
  of the report and whose labels ``running_lora_adapters`` and
  ``waiting_lora_adapters`` are comma-separated names, ``max_lora`` the slots
  (vllm/v1/metrics/loggers.py).
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from typing import Any

from aiohttp import web


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": kind,
                              "param": None, "code": status}, status=status)


class LoraEngine:
    """One replica's adapters: registered, in host memory, and running."""

    def __init__(self, slots: int, cpu_slots: int, load_time: float, *,
                 check_paths: bool = True, mounts: dict[str, str] | None = None) -> None:
        self.slots = slots
        self.cpu_slots = max(cpu_slots, slots)
        self.load_time = load_time
        self.check_paths = check_paths
        self.mounts = dict(mounts or {})
        self.registered: dict[str, str] = {}                 # name → path, in load order
        self._memory: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.running: collections.Counter[str] = collections.Counter()
        self.waiting: collections.Counter[str] = collections.Counter()
        self._changed = asyncio.Condition()
        self._reading: dict[str, asyncio.Future[None]] = {}
        self.disk_loads = 0
        self.load_calls = 0

    @property
    def enabled(self) -> bool:
        return self.slots > 0

    def on_host(self, path: str) -> str:
        """Where the engine's ``path`` is read, through the longest mount above it."""
        for inside in sorted(self.mounts, key=len, reverse=True):
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return self.mounts[inside] + path[len(inside.rstrip("/")):]
        return path

    def in_memory(self) -> list[str]:
        return list(self._memory)

    # ------------------------------------------------------------ memory

    async def _read(self, name: str) -> None:
        """Bring ``name`` into host memory from disk, once however many ask at the same time."""
        if name in self._memory:
            self._memory.move_to_end(name)
            return
        pending = self._reading.get(name)
        if pending is not None:
            await asyncio.shield(pending)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading[name] = future
        try:
            self.disk_loads += 1
            await asyncio.sleep(self.load_time)
            self._memory[name] = None
            self._evict()
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._reading[name]

    def _evict(self) -> None:
        while len(self._memory) > self.cpu_slots:
            victim = next((n for n in self._memory if not self.running[n]), None)
            if victim is None:
                return
            del self._memory[victim]

    # ------------------------------------------------------------ requests

    async def acquire(self, name: str) -> None:
        """Hold a batch slot for a request of adapter ``name`` (registered), reading it
        from disk first if it was pushed out of memory."""
        async with self._changed:
            self.waiting[name] += 1
            try:
                await self._changed.wait_for(
                    lambda: self.running[name] > 0 or
                    sum(1 for n, c in self.running.items() if c) < self.slots)
            finally:
                self.waiting[name] -= 1
            self.running[name] += 1
        try:
            await self._read(name)
        except BaseException:
            await self.release(name)
            raise

    async def release(self, name: str) -> None:
        async with self._changed:
            self.running[name] -= 1
            if self.running[name] <= 0:
                del self.running[name]
            self._changed.notify_all()

    # ------------------------------------------------------------ HTTP

    async def load(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            return _error(400, "InvalidUserInput",
                          "Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.registered:
            return _error(400, "InvalidUserInput",
                          f"The lora adapter '{name}' has already been loaded.")
        config = os.path.join(self.on_host(path), "adapter_config.json")
        if self.check_paths and not await asyncio.to_thread(os.path.isfile, config):
            return _error(404, "NotFoundError",
                          f"No adapter found for {path}: adapter_config.json is missing")
        self.load_calls += 1
        self.registered[name] = path
        try:
            await self._read(name)
        except BaseException:
            self.registered.pop(name, None)
            raise
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return _error(400, "InvalidUserInput",
                          "either 'lora_name' and 'lora_int_id' needs to be provided.")
        if name not in self.registered:
            return _error(404, "NotFoundError",
                          f"The lora adapter '{name}' cannot be found.")
        del self.registered[name]
        self._memory.pop(name, None)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def cards(self, base: str) -> list[dict[str, Any]]:
        return [{"id": name, "object": "model", "created": 0, "owned_by": "vllm",
                 "root": path, "parent": base} for name, path in self.registered.items()]

    def metric_lines(self) -> list[str]:
        if not self.enabled:
            return []
        running = ",".join(sorted(n for n, c in self.running.items() if c))
        waiting = ",".join(sorted(n for n, c in self.waiting.items() if c))
        return ["# HELP vllm:lora_requests_info Running stats on lora requests.",
                "# TYPE vllm:lora_requests_info gauge",
                f'vllm:lora_requests_info{{max_lora="{self.slots}",'
                f'running_lora_adapters="{running}",waiting_lora_adapters="{waiting}"}} '
                f"{time.time()}"]


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
