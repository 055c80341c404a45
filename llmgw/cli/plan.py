"""``llmgw ctl model plan REPO_OR_DIR``: every way a model fits the fleet.

The model is read here, on the machine running the command: a checkpoint
directory, or a Hub repository through huggingface-hub (with this machine's
HF_TOKEN). Without ``--pool`` the request, carrying the model's config.json
and parameter count, goes to the API, which plans against the live fleet;
with ``--pool`` nothing is asked of a server, so hardware that is not there
yet can be planned from a laptop.
"""

from __future__ import annotations

import re

import click
import msgspec

from llmgw.catalog.source import HfSource, parse_source
from llmgw.catalog.units import format_size
from llmgw.cli.client import ApiClient, pass_client
from llmgw.cli.output import failures, output_option, print_json, print_table
from llmgw.errors import DefinitionError
from llmgw.planner.candidates import PoolSpec, parse_pool
from llmgw.planner.plan import PlanOptions, PlanRequest, PlanResult, plan_model
from llmgw.planner.quant import QUANTIZATIONS

GiB = 1024**3
_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT]?)\s*$")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def _param_count(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A parameter count: 70553706496, or 70.6B / 8B / 500M."""
    if value is None:
        return None
    match = _COUNT_RE.match(value)
    if match is None:
        raise click.BadParameter(f"{value!r} is not a parameter count; write e.g. 70553706496 "
                                 "or 70.6B")
    n = int(float(match.group(1)) * _SCALE[match.group(2).lower()])
    if n <= 0:
        raise click.BadParameter(f"a parameter count must be positive, got {value!r}")
    return n


def _pools(values: tuple[str, ...]) -> list[PoolSpec]:
    pools = []
    for value in values:
        try:
            pools.append(parse_pool(value))
        except DefinitionError as exc:
            raise click.BadParameter(exc.message, param_hint="--pool") from None
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise click.BadParameter("each --pool needs its own NAME", param_hint="--pool")
    return pools


def _context(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def _size(n: int) -> str:
    """A weight size: GiB at two decimals, the resolution of the planner's 1% calibration
    (one decimal of 8.37 GiB is 0.6%); smaller sizes as everywhere else."""
    return f"{n / GiB:.2f}GiB" if n >= GiB else format_size(n)


def _print(result: PlanResult) -> None:
    a = result.architecture
    shape = f"{a.layers} layers, {a.attention_heads} heads, {a.kv_heads} KV heads"
    if a.experts:
        shape += f", {a.experts} experts ({a.experts_per_token} active)"
    if a.kv_lora_rank:
        shape += f", latent KV {a.kv_lora_rank}"
    click.echo(f"model:      {result.model} ({a.model_type}; {shape})")
    click.echo(f"parameters: {result.parameters:,} (config.json describes "
               f"{result.parameters_in_config:,})")
    for note in result.notes:
        click.echo(f"note:       {note}")
    rows = [
        (c.pool, c.gpus or "cpu", c.quantization, c.engine,
         _size(c.weights_bytes_per_gpu) if c.gpus else "-", _size(c.host_bytes),
         _size(c.weights_bytes_total), format_size(c.kv_bytes_per_token),
         _context(c.max_context), "yes" if c.fits else "no",
         ("" if c.free_now is None else "free now" if c.free_now else "busy now")
         if c.fits else c.reason)
        for c in result.candidates
    ]
    print_table(rows, ["pool", "gpus", "quant", "engine", "weights/gpu", "host",
                       "weights total", "kv/token", "max context", "fits", "reason"])
    lora = next((c for c in result.candidates if c.lora_bytes_per_gpu), None)
    if lora is not None:
        # The adapters' reservation is in every vLLM row's fit (before any context).
        by_gpus = sorted({(c.gpus, c.lora_bytes_per_gpu) for c in result.candidates
                          if c.lora_bytes_per_gpu})
        per = ", ".join(f"{format_size(b)} on each of {g} GPU{'s' if g > 1 else ''}"
                        for g, b in by_gpus)
        click.echo(f"lora:       adapter slots reserve {per}; the host cache holds "
                   f"{format_size(lora.lora_host_bytes)} (llmgw.planner.lora)")


@click.command("plan")
@click.argument("source", metavar="REPO_OR_DIR")
@click.option("--pool", "pool_texts", multiple=True, metavar="NAME=COUNTxMEMORY[@FABRIC]",
              help="Plan against COUNT cards of MEMORY on one node (e.g. h100=8x81559MiB@ib-a) "
                   "instead of the live fleet; COUNT 0 is a CPU node with MEMORY of host "
                   "memory (e.g. cpu=0x256GB), planned on llama.cpp. Repeatable. Needs no "
                   "server.")
@click.option("--params", metavar="N", callback=_param_count, default=None,
              help="Parameter count, overriding the checkpoint's (e.g. 70553706496 or 70.6B).")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit).")
@click.option("--kv-dtype", type=click.Choice(["fp16", "bf16", "fp8", "q8_0"]),
              default="fp16", show_default=True,
              help="KV cache type: fp8 for vLLM, q8_0 for llama.cpp.")
@click.option("--usable-fraction", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Share of each card the engine may use, reserved once "
                   "(vLLM's --gpu-memory-utilization; default 0.9).")
@click.option("--engine", type=click.Choice(["vllm", "llama.cpp", "llama-cpp-python"]),
              default=None,
              help="Plan for one engine. Default: GGUF mixes on llama.cpp, the rest on vLLM.")
@click.option("--min-context", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Context a candidate must hold at least to fit.")
@click.option("--quantization", "-q", "quantizations", multiple=True,
              type=click.Choice(list(QUANTIZATIONS)),
              help="Only these quantisations (repeatable).")
@click.option("--lora-slots", type=click.IntRange(min=0), default=0, show_default=True,
              help="Serve LoRA adapters: this many on each GPU at once (the base's "
                   "lora.slots, vLLM's --max-loras); their memory counts in the fit.")
@click.option("--lora-rank", type=click.IntRange(min=1), default=16, show_default=True,
              help="The adapters' largest rank (lora.max_rank, --max-lora-rank).")
@click.option("--lora-cpu-slots", type=click.IntRange(min=0), default=None,
              help="Adapters kept in host memory (lora.cpu_slots; default 4 x slots).")
@output_option
@pass_client
def plan(client: ApiClient, source: str, pool_texts: tuple[str, ...], params: int | None,
         revision: str | None, kv_dtype: str, usable_fraction: float | None,
         engine: str | None, min_context: int, quantizations: tuple[str, ...],
         lora_slots: int, lora_rank: int, lora_cpu_slots: int | None,
         output: str) -> None:
    """List every way REPO_OR_DIR fits: quantisation, GPUs, weights, KV and context.

    REPO_OR_DIR is a Hugging Face repository (Qwen/Qwen2.5-14B-Instruct, optionally
    @REVISION) or a checkpoint directory holding config.json and its safetensors
    (or give --params). Fitting candidates come first; each other one says why it
    does not fit. Weights are shown where they sit: on the most loaded GPU, in
    host memory, and in total over both (a copy, such as llama.cpp's output layer
    of a tied model, counts each time). --output json prints the candidates as a
    list.
    """
    pools = _pools(pool_texts)
    from llmgw.planner.inputs import resolve_model

    with failures():
        found = resolve_model(source, params=params, revision=revision)
        options = msgspec.convert(
            {"kv_dtype": kv_dtype, "usable_fraction": usable_fraction, "engine": engine,
             "min_context": min_context, "quantizations": list(quantizations),
             "lora_slots": lora_slots, "lora_rank": lora_rank,
             "lora_cpu_slots": lora_cpu_slots},
            PlanOptions)
        request = PlanRequest(model=found.name, config=found.config,
                              parameters=found.parameters, pools=pools or None,
                              options=options)
        if pools:
            result = plan_model(request, pools)
        else:
            answer = client.post("/api/v1/plan", json=msgspec.to_builtins(request))
            result = msgspec.convert(answer, PlanResult)
    if output == "json":
        print_json(msgspec.to_builtins(result.candidates))
    else:
        _print(result)
        if not pools and found.repository is not None:
            with failures():
                for line in warm_lines(client, found.repository):
                    click.echo(line)


def warm_lines(client: ApiClient, repo: str) -> list[str]:
    """For each catalog model of this repository, the live nodes holding its weights."""
    models = []
    for m in client.get("/api/v1/models"):
        # Read by the catalog's own parser; the Hub ignores the case of a repository id.
        try:
            source = parse_source(m.get("definition", {}).get("source"))
        except ValueError:
            continue  # no source this client reads, so none of this repository
        if isinstance(source, HfSource) and source.repo_id.lower() == repo.lower():
            models.append(m)
    if not models:
        return []
    fleet = client.get("/api/v1/fleet")
    out = []
    for m in models:
        warm = [n["name"] for n in fleet.get("nodes", []) if m["name"] in (n.get("warm") or [])]
        held = ", ".join(warm) if warm else "none yet (`llmgw ctl model prefetch` fetches ahead)"
        out.append(f"warm for {m['name']}: {held}")
    return out

