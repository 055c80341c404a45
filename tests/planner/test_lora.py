"""LoRA memory in the plan: slots x rank x the base's adapted layers, and the host cache."""

from __future__ import annotations

from llmgw.planner.arch import architecture_from_config
from llmgw.planner.candidates import PoolSpec
from llmgw.planner.lora import adapter_params, lora_memory, slot_bytes_per_gpu
from tests.planner.fixtures import load_config
from tests.planner.test_plan import MiB, pick, plan


def test_one_llama_8b_slot_at_rank_16_is_the_published_lora_size() -> None:
    """Llama-3.1-8B, all seven projections at rank 16: 41,943,040 parameters (PEFT's count
    for target_modules q,k,v,o,gate,up,down), 80 MiB in bf16."""
    a = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    assert adapter_params(a, 16) == 41_943_040
    assert slot_bytes_per_gpu(a, 16) == 80 * MiB
    m = lora_memory(a, slots=4, max_rank=16, cpu_slots=16)
    assert m.bytes_per_gpu == 320 * MiB
    assert m.host_bytes == 1280 * MiB


def test_tensor_parallel_ranks_hold_their_shard_and_the_replicated_factor() -> None:
    """Over two GPUs each holds more than half a slot: one factor of each matrix is whole."""
    a = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    one, two = slot_bytes_per_gpu(a, 16, 1), slot_bytes_per_gpu(a, 16, 2)
    assert one / 2 < two < one


def test_the_plan_counts_adapter_slots_in_the_fit_and_shows_them() -> None:
    """The reservation shrinks the context that fits, and enough of it does not fit."""
    # An L4's 24 GB: small enough that the context is bounded by memory, not the model.
    pools = [PoolSpec(name="l4", gpus_per_node=1, gpu_memory=23034 * MiB)]
    plain = pick(plan("llama-3.1-8b-instruct", pools), "bf16", 1)
    with_lora = pick(plan("llama-3.1-8b-instruct", pools, lora_slots=4, lora_rank=16),
                     "bf16", 1)
    assert plain.lora_bytes_per_gpu == 0
    assert with_lora.lora_bytes_per_gpu == 320 * MiB
    assert with_lora.lora_host_bytes == 1280 * MiB
    assert with_lora.overhead_bytes_per_gpu == plain.overhead_bytes_per_gpu + 320 * MiB
    assert with_lora.max_context < plain.max_context
    huge = pick(plan("llama-3.1-8b-instruct", pools, lora_slots=256, lora_rank=512),
                "bf16", 1)
    assert not huge.fits
