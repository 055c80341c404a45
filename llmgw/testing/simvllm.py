"""The simulated engine behind vLLM's command line, for schedulers that start "vLLM".

The embedded scheduler starts ``python -m vllm.entrypoints.openai.api_server``
with the flags ``llmgw.scheduler.local.engines`` writes; a Nomad job's engine
task gets the same flags (``llmgw.scheduler.nomad.render``). ``main`` reads
that command line as vLLM's server would — ``--port``, ``--host``,
``--served-model-name``, ``--enable-lora``, ``--max-loras``,
``--max-cpu-loras`` — and serves a ``SimEngine`` accordingly, so a test can
run the real scheduler against a replica that behaves like vLLM without a
GPU. As in vLLM, the adapter load and unload endpoints exist only when the
environment holds ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: a launch that
forgot the switch serves no adapters, and the test sees it.

A test puts a package ``vllm/entrypoints/openai/api_server.py`` on the
engine's ``PYTHONPATH`` (``write_vllm_shim``) whose body calls ``main()``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import msgspec

from llmgw.testing.simengine import SimEngine, SimSpec

_SHIM = "from llmgw.testing.simvllm import main\n\nmain()\n"


def write_vllm_shim(root: Path) -> Path:
    """A ``vllm`` package under ``root`` whose OpenAI server is the simulated engine;
    put ``root`` on the engine's PYTHONPATH."""
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(_SHIM)
    return root


def spec_from_args(argv: list[str] | None = None,
                   env: dict[str, str] | None = None) -> tuple[argparse.Namespace, SimSpec]:
    """vLLM's flags (the ones that matter here; the rest are accepted and ignored)."""
    parser = argparse.ArgumentParser(prog="vllm.entrypoints.openai.api_server")
    parser.add_argument("--model", default="model")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--max-cpu-loras", type=int, default=None)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    args, _ = parser.parse_known_args(argv)
    environ = os.environ if env is None else env
    base = msgspec.convert(json.loads(environ.get("LLMGW_SIM_SPEC", "{}")), SimSpec)
    runtime = environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    slots = args.max_loras if args.enable_lora and runtime else 0
    spec = msgspec.structs.replace(base, lora_slots=slots,
                                   lora_cpu_slots=args.max_cpu_loras or args.max_loras)
    return args, spec


async def _serve(args: argparse.Namespace, spec: SimSpec) -> None:
    engine = SimEngine(spec, name=args.served_model_name or args.model)
    await engine.start(port=args.port, host=args.host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await engine.stop()


def main(argv: list[str] | None = None) -> None:
    args, spec = spec_from_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args, spec))


if __name__ == "__main__":
    main()
