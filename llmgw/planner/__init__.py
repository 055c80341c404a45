"""The planner: every way a model fits the fleet, from its own config.json.

Getting placement arithmetic wrong is not an error message, it is an
out-of-memory twenty minutes into a load, so every number here is derived
rather than typed: the architecture from the model's ``config.json`` (or
the header of its GGUF file, which llama.cpp-only models have instead), the
weights from the on-disk formats (GGUF block layouts and llama.cpp's own mix
rules, fp8, AWQ/GPTQ group scales), the KV cache from what vLLM and llama.cpp
actually allocate, and the hardware from the running fleet.

Layers, each importing only the ones above it and no I/O library except
``inputs`` (which reads files and the Hub):

    arch        config.json -> Architecture (refuses what it cannot reason about)
    gguf        a GGUF header -> the config.json it stands for, and its file type
    tensors     Architecture -> the tensor inventory, and how engines split it
    quant       bytes of each tensor in each quantisation
    memory      per-GPU arithmetic: weights share, KV per token, overhead, max context
    candidates  pools (never spanning fabrics or nodes) and the candidate list
    plan        the request/result structs, ``plan_model`` (the one entry point) and
                ``host_breakdown`` (one replica's host memory, for checking a reservation)
    reserve     a catalog entry's memory reservations against that need (add-time warnings)
    inputs      reading config.json and the parameter count (local dir or Hub), and a
                source's GGUF header or checkpoint for ``reserve``

The two errors this package exists to avoid, both in memory.py: the runtime's
overhead is charged per rank from that rank's share, never from the whole
model; and the usable fraction of a card is reserved exactly once.
"""

from llmgw.planner.arch import Architecture, architecture_from_config
from llmgw.planner.candidates import PoolSpec, parse_pool, pools_from_fleet
from llmgw.planner.plan import (
    Candidate,
    HostNeed,
    PlanOptions,
    PlanRequest,
    PlanResult,
    host_breakdown,
    host_need,
    plan_model,
)

__all__ = [
    "Architecture",
    "Candidate",
    "HostNeed",
    "PlanOptions",
    "PlanRequest",
    "PlanResult",
    "PoolSpec",
    "architecture_from_config",
    "host_breakdown",
    "host_need",
    "parse_pool",
    "plan_model",
    "pools_from_fleet",
]
