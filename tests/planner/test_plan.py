"""Candidates: per-GPU arithmetic, pools that never span, every option listed."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.errors import DefinitionError
from llmgw.planner.arch import architecture_from_config
from llmgw.planner.candidates import PoolSpec, parse_pool, pools_from_fleet, tp_problem
from llmgw.planner.memory import ENGINES, gpu_loads, kv_bytes, overhead
from llmgw.planner.plan import (
    Candidate,
    ParameterCount,
    PlanOptions,
    PlanRequest,
    PlanResult,
    plan_model,
)
from llmgw.planner.quant import weights_by_tensor
from llmgw.planner.tensors import inventory
from llmgw.scheduler.base import Fleet, NodeView, Pool
from tests.planner.fixtures import MODELS, load_config

GiB = 1024**3
MiB = 1024**2
H100 = 81559 * MiB  # what an "80 GB" H100 reports


def plan(name: str, pools: list[PoolSpec], **options: object) -> PlanResult:
    params = MODELS[name].params
    count = ParameterCount(total=params, source="hub") if params else None
    request = PlanRequest(model=name, config=load_config(name), parameters=count,
                          options=PlanOptions(**options))  # type: ignore[arg-type]
    return plan_model(request, pools)


def pick(result: PlanResult, quant: str, gpus: int, engine: str = "vllm") -> Candidate:
    (c,) = [c for c in result.candidates
            if (c.quantization, c.gpus, c.engine) == (quant, gpus, engine)]
    return c


def test_p5_llama_70b_bf16_fits_two_80gb_cards_with_useful_context() -> None:
    """Llama-3.3-70B at bf16 over two 80 GB H100s fits, with tens of thousands of tokens."""
    result = plan("llama-3.3-70b-instruct", [PoolSpec(name="h100", gpus_per_node=2,
                                                      gpu_memory=H100)])
    c = pick(result, "bf16", 2)
    assert c.fits, c.reason
    assert c.max_context >= 16_384
    assert c.weights_bytes_per_gpu == pytest.approx(70_553_706_496, rel=0.005)
    one = pick(result, "bf16", 1)
    assert not one.fits
    assert "exceed" in (one.reason or "")


def test_overhead_is_charged_from_each_ranks_share() -> None:
    """The overhead of a TP2 rank is computed from its half, not the whole model's.

    Charging a rank the whole model's activations (the seed's first error) would
    make TP2's overhead at least TP1's; from the share it is less, plus the
    all-reduce buffers TP adds.
    """
    a = architecture_from_config(load_config("llama-3.3-70b-instruct"))
    vllm = ENGINES["vllm"]
    one = overhead(a, vllm, 1, H100, holds_output=True)
    two = overhead(a, vllm, 2, H100, holds_output=True)
    assert two - vllm.comm_bytes < one
    assert two < 3 * GiB


def test_usable_fraction_is_reserved_exactly_once() -> None:
    """Weights + overhead + KV(max_context) fill usable x card, and one more block would not fit."""
    a = architecture_from_config(load_config("llama-3.3-70b-instruct"))
    inv = inventory(a)
    sizes = weights_by_tensor(inv, "bf16", a, "bf16")
    (ld,) = gpu_loads(a, inv, sizes, ENGINES["vllm"], 2, "fp16", H100)
    result = plan("llama-3.3-70b-instruct", [PoolSpec(name="h", gpus_per_node=2,
                                                      gpu_memory=H100)])
    c = pick(result, "bf16", 2)
    usable = int(H100 * 0.9)
    used = c.weights_bytes_per_gpu + c.overhead_bytes_per_gpu
    assert used + kv_bytes(ld, a, ENGINES["vllm"], c.max_context, H100) <= usable
    assert used + kv_bytes(ld, a, ENGINES["vllm"], c.max_context + 16, H100) > usable
    # A higher usable fraction buys context one for one; nothing else holds slack back.
    wider = pick(plan("llama-3.3-70b-instruct", [PoolSpec(name="h", gpus_per_node=2,
                                                          gpu_memory=H100)],
                      usable_fraction=0.95), "bf16", 2)
    gained = (wider.max_context - c.max_context) * c.kv_bytes_per_token
    assert gained == pytest.approx(int(H100 * 0.95) - usable, abs=16 * c.kv_bytes_per_token)


def test_context_is_capped_at_max_position_embeddings() -> None:
    """A small model on a big card gets max_position_embeddings, not more."""
    c = pick(plan("qwen2.5-14b-instruct", [PoolSpec(name="h", gpus_per_node=1,
                                                    gpu_memory=H100)]), "bf16", 1)
    assert c.fits
    assert c.max_context == 32_768


def test_candidates_never_exceed_a_node() -> None:
    """A pool of 4-GPU nodes offers at most 4 GPUs, however many nodes it has."""
    result = plan("llama-3.3-70b-instruct",
                  [PoolSpec(name="l40s", gpus_per_node=4, gpu_memory=46068 * MiB, nodes=10)])
    assert max(c.gpus for c in result.candidates) == 4


def test_tensor_parallel_sizes_divide_heads() -> None:
    """Qwen2.5-14B (40 heads, 8 KV heads) on 8 GPUs: TP 1, 2, 4, 8 only."""
    result = plan("qwen2.5-14b-instruct", [PoolSpec(name="h", gpus_per_node=8, gpu_memory=H100)],
                  engine="vllm", quantizations=["bf16"])
    assert sorted({c.gpus for c in result.candidates}) == [1, 2, 4, 8]
    a = architecture_from_config(load_config("qwen2.5-14b-instruct"))
    assert "40 attention heads" in (tp_problem(a, 3) or "")
    assert "KV heads" in (tp_problem(a, 5) or "")


def test_awq_group_alignment_is_a_reason() -> None:
    """AWQ at TP8 splits Qwen2.5-14B's 13824-wide down_proj into 1728, not whole 128-groups."""
    result = plan("qwen2.5-14b-instruct", [PoolSpec(name="h", gpus_per_node=8, gpu_memory=H100)],
                  quantizations=["awq"])
    c = pick(result, "awq", 8)
    assert not c.fits
    assert "1728 per GPU" in (c.reason or "")
    assert pick(result, "awq", 4).fits


def test_every_candidate_listed_fitting_first_with_reasons() -> None:
    """Fitting candidates come first; every other one carries a reason."""
    result = plan("llama-3.3-70b-instruct", [PoolSpec(name="l40s", gpus_per_node=2,
                                                      gpu_memory=46068 * MiB)])
    flags = [c.fits for c in result.candidates]
    assert flags == sorted(flags, reverse=True)
    assert any(flags)
    assert not all(flags)
    assert all(c.reason for c in result.candidates if not c.fits)
    assert all(c.reason is None for c in result.candidates if c.fits)
    quants = {c.quantization for c in result.candidates}
    assert {"bf16", "fp8", "int8", "awq", "gptq", "q8_0", "q6_K", "q5_K_M", "q4_K_M",
            "q4_0"} <= quants


def test_context_too_small_is_the_reason() -> None:
    """A candidate whose weights fit but whose KV holds too few tokens says so."""
    result = plan("llama-3.3-70b-instruct", [PoolSpec(name="h", gpus_per_node=1,
                                                      gpu_memory=H100)],
                  quantizations=["fp8"], min_context=8192)
    c = pick(result, "fp8", 1)
    assert not c.fits
    assert "tokens of KV cache fit" in (c.reason or "")


def test_llama_cpp_splits_layers_and_keeps_embeddings_on_host() -> None:
    """llama.cpp over 2 GPUs: the token embedding is in host memory, the rest split by layer."""
    a = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    inv = inventory(a)
    sizes = weights_by_tensor(inv, "q8_0", a, "gguf")
    loads = gpu_loads(a, inv, sizes, ENGINES["llama.cpp"], 2, "fp16", H100)
    embed = next(s for t, s in zip(inv, sizes, strict=True) if t.role == "token_embd")
    assert sum(ld.weights for ld in loads) == sum(sizes) - embed
    assert sum(ld.kv_per_token for ld in loads) == 131_072


def test_cpu_pool_gets_a_llama_cpp_candidate() -> None:
    """A CPU pool plans GGUF on llama.cpp with the whole model in host memory."""
    pools = [PoolSpec(name="cpu", gpus_per_node=0, memory=64 * GiB)]
    result = plan("llama-3.1-8b-instruct", pools)
    assert {c.engine for c in result.candidates} == {"llama.cpp"}
    c = pick(result, "q4_K_M", 0, "llama.cpp")
    assert c.fits
    a = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    gguf = sum(weights_by_tensor(inventory(a), "q4_K_M", a, "gguf"))
    assert (c.weights_bytes_per_gpu, c.host_bytes, c.weights_bytes_total) == (0, gguf, gguf)


def test_cpu_pool_says_why_vllm_is_left_out() -> None:
    """VLLM has no row on a CPU pool; one note names the pool and says vLLM needs a GPU."""
    result = plan("llama-3.1-8b-instruct", [parse_pool("epyc=0x512GB")])
    assert {c.engine for c in result.candidates} == {"llama.cpp"}
    assert "epyc has no GPU: vLLM needs one" in " ".join(result.notes)


def test_surplus_parameters_are_charged_to_vllm_only() -> None:
    """Gemma 3 27B's vision tower: vLLM is charged it at 16 bits, the GGUF is not."""
    result = plan("gemma-3-27b-it", [PoolSpec(name="h", gpus_per_node=1, gpu_memory=H100)])
    assert any("vision tower" in n for n in result.notes)
    bf16 = pick(result, "bf16", 1)
    assert bf16.weights_bytes_per_gpu == pytest.approx(27_432_406_640 * 2, rel=0.001)


def test_packed_checkpoint_count_is_not_a_parameter_count() -> None:
    """A count of U8-packed MXFP4 elements is noted and the config's shapes are used."""
    request = PlanRequest(model="gpt-oss-120b", config=load_config("gpt-oss-120b"),
                          parameters=ParameterCount(total=63_000_000_000, source="hub",
                                                    by_dtype={"BF16": 2_000_000_000,
                                                              "U8": 61_000_000_000}))
    result = plan_model(request, [PoolSpec(name="h", gpus_per_node=1, gpu_memory=H100)])
    assert any("packed" in n for n in result.notes)
    c = pick(result, "mxfp4", 1)
    assert c.fits
    assert 60 * GiB < c.weights_bytes_per_gpu < 66 * GiB


def test_window_note_says_which_engine_caps() -> None:
    """Mistral's window: vLLM caps it, llama.cpp runs it as full attention."""
    result = plan("mistral-7b-v0.1", [PoolSpec(name="h", gpus_per_node=1, gpu_memory=H100)])
    note = next(n for n in result.notes if n.startswith("sliding window"))
    assert "vllm caps" in note
    assert "llama.cpp runs them as full attention" in note


def test_kv_dtype_the_engine_lacks_leaves_it_out_or_refuses() -> None:
    """Q8_0 KV drops vLLM candidates with a note; asking vLLM for it outright is refused."""
    pools = [PoolSpec(name="h", gpus_per_node=1, gpu_memory=H100)]
    result = plan("llama-3.1-8b-instruct", pools, kv_dtype="q8_0")
    assert {c.engine for c in result.candidates} == {"llama.cpp"}
    with pytest.raises(DefinitionError, match="vllm has no q8_0 KV cache"):
        plan("llama-3.1-8b-instruct", pools, kv_dtype="q8_0", engine="vllm")


def test_bad_options_are_refused() -> None:
    """A usable fraction outside (0, 1] or an unknown quantisation names the option."""
    pools = [PoolSpec(name="h", gpus_per_node=1, gpu_memory=H100)]
    with pytest.raises(DefinitionError, match="usable_fraction"):
        plan("llama-3.1-8b-instruct", pools, usable_fraction=1.5)
    with pytest.raises(DefinitionError, match="unknown quantisation q3_K"):
        plan("llama-3.1-8b-instruct", pools, quantizations=["q3_K"])


@pytest.mark.parametrize(("text", "message"), [
    ("h100", "not NAME=COUNTxMEMORY"),
    ("h100=8", "not NAME=COUNTxMEMORY"),
    ("h100=-2x80GB", "at least 0"),
    ("cpu=0x0GB", "host memory of a CPU node must be more than 0"),
    ("h100=8x0GB", "more than 0"),
    ("h100=8xlots", "not a size"),
])
def test_malformed_pools_are_refused(text: str, message: str) -> None:
    """--pool must be NAME=COUNTxMEMORY[@FABRIC] with positive sizes."""
    with pytest.raises(DefinitionError, match=message):
        parse_pool(text)


def test_pool_of_zero_gpus_is_a_cpu_node_as_the_fleet_builds_it() -> None:
    """Cpu=0x256GB is the PoolSpec pools_from_fleet makes for a CPU node of 256 GB."""
    p = parse_pool("cpu=0x256GB")
    fleet = Fleet(nodes=[node_epyc_256g("cpu-1")], pools=[Pool(name="cpu", gpu_class=None,
                                                                fabric=None,
                                            gpu_memory=None, nodes=["cpu-1"], gpus_total=0,
                                            gpus_free=0, largest_free_gpus_on_a_node=0)])
    (from_fleet,) = pools_from_fleet(fleet)[0]
    assert p == msgspec.structs.replace(from_fleet, free_gpus_per_node=None)


def test_pool_parses_fabric() -> None:
    """H100=8x81559MiB@ib-a is 8 cards of 81559 MiB on fabric ib-a."""
    p = parse_pool("h100=8x81559MiB@ib-a")
    assert (p.gpus_per_node, p.gpu_memory, p.fabric) == (8, H100, "ib-a")


def node_8x_h100_80g(name: str, fabric: str, free: int = 8) -> NodeView:
    return NodeView(name=name, id=name, status="ready", schedulable=True, gpu_class="h100-80g",
                    gpu_device="NVIDIA H100 80GB HBM3", fabric=fabric, gpus_total=8,
                    gpus_free=free, gpu_memory=H100, cores_total=96, cores_free=96,
                    memory_total=1024 * GiB, memory_free=1024 * GiB)


def node_epyc_256g(name: str) -> NodeView:
    return NodeView(name=name, id=name, status="ready", schedulable=True, gpu_class=None,
                    gpu_device=None, fabric=None, gpus_total=0, gpus_free=0, gpu_memory=None,
                    cores_total=64, cores_free=64, memory_total=256 * 10**9,
                    memory_free=256 * 10**9)


def test_fleet_pools_stay_per_fabric_and_skip_unschedulable_nodes() -> None:
    """Two fabrics of H100s stay two pools; a drained 16-GPU node is not counted."""
    a1, a2 = node_8x_h100_80g("gpu-a1", "ib-a", 2), node_8x_h100_80g("gpu-a2", "ib-a", 4)
    b1 = node_8x_h100_80g("gpu-b1", "ib-b", 8)
    drained = msgspec.structs.replace(node_8x_h100_80g("gpu-b2", "ib-b"), schedulable=False,
                                      gpus_total=16, gpus_free=16)
    fleet = Fleet(nodes=[a1, a2, b1, drained], pools=[
        Pool(name="h100-80g/ib-a", gpu_class="h100-80g", fabric="ib-a", gpu_memory=H100,
             nodes=["gpu-a1", "gpu-a2"], gpus_total=16, gpus_free=6,
             largest_free_gpus_on_a_node=4),
        Pool(name="h100-80g/ib-b", gpu_class="h100-80g", fabric="ib-b", gpu_memory=H100,
             nodes=["gpu-b1", "gpu-b2"], gpus_total=24, gpus_free=24,
             largest_free_gpus_on_a_node=16),
    ])
    pools, notes = pools_from_fleet(fleet)
    assert [(p.name, p.gpus_per_node, p.free_gpus_per_node, p.fabric) for p in pools] == [
        ("h100-80g/ib-a", 8, 4, "ib-a"), ("h100-80g/ib-b", 8, 8, "ib-b")]
    assert notes == []
    result = plan_model(PlanRequest(model="m", config=load_config("llama-3.3-70b-instruct")),
                        pools)
    on_a = [c for c in result.candidates if c.pool == "h100-80g/ib-a"
            and (c.engine, c.quantization, c.gpus) == ("vllm", "bf16", 8)]
    assert [c.free_now for c in on_a] == [False]  # 8 GPUs per node exist; 4 are free now
    assert max(c.gpus for c in result.candidates) == 8


def test_pool_without_schedulable_nodes_is_noted() -> None:
    """A pool whose only node is drained is left out, and the note says so."""
    drained = msgspec.structs.replace(node_8x_h100_80g("gpu-c1", "ib-c"), schedulable=False)
    fleet = Fleet(nodes=[drained], pools=[
        Pool(name="h100-80g/ib-c", gpu_class="h100-80g", fabric="ib-c", gpu_memory=H100,
             nodes=["gpu-c1"], gpus_total=8, gpus_free=8, largest_free_gpus_on_a_node=8)])
    pools, notes = pools_from_fleet(fleet)
    assert pools == []
    assert "no schedulable node" in notes[0]
