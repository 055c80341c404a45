"""GGUF headers for the planner's tests, written the way llama.cpp's converter writes them."""

from __future__ import annotations

from typing import Any

from llmgw.planner.arch import Architecture, architecture_from_config
from llmgw.weights.gguf import GgufInfo, GgufTensor
from tests.gguf_writer import gguf_bytes
from tests.planner.fixtures import load_config

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2",
             "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "phi3": "phi3",
             "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2", "gpt_oss": "gpt-oss",
             "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3"}


def header_of(a: Architecture, *, mla_per_head_keys: bool = True) -> GgufInfo:
    """The header convert_hf_to_gguf.py writes for a checkpoint of shape ``a``.

    Its base class writes the block, context, embedding, feed-forward and head
    counts, the key length when config.json gives head_dim, the expert counts
    and the file type; the families add their own keys (the window, the
    experts' width, DeepSeek's latent attention). ``mla_per_head_keys``: a
    DeepSeek file converted since llama.cpp decompresses MLA at load time
    (key_length then holds the latent, key_length_mla the per-head size).
    """
    arch = GGUF_ARCH[a.model_type]
    m: dict[str, Any] = {
        "general.architecture": arch, "general.file_type": 15,
        f"{arch}.block_count": a.num_layers, f"{arch}.context_length":
        a.max_position_embeddings, f"{arch}.embedding_length": a.hidden_size,
        f"{arch}.feed_forward_length": a.intermediate_size,
        f"{arch}.attention.head_count": a.num_heads,
        f"{arch}.attention.head_count_kv": a.num_kv_heads,
        f"{arch}.attention.key_length": a.head_dim,
        f"{arch}.attention.value_length": a.v_head_dim,
    }
    if a.sliding_window is not None:
        m[f"{arch}.attention.sliding_window"] = a.sliding_window
    if a.num_experts:
        m[f"{arch}.expert_count"] = a.num_experts
        m[f"{arch}.expert_used_count"] = a.experts_per_token
        if a.family != "mixtral":
            m[f"{arch}.expert_feed_forward_length"] = a.moe_intermediate_size
    if a.is_mla:
        m[f"{arch}.rope.dimension_count"] = a.qk_rope_head_dim
        m[f"{arch}.attention.kv_lora_rank"] = a.kv_lora_rank
        if a.q_lora_rank:
            m[f"{arch}.attention.q_lora_rank"] = a.q_lora_rank
        m[f"{arch}.expert_shared_count"] = a.shared_experts
        m[f"{arch}.leading_dense_block_count"] = len(a.dense_layers)
        if mla_per_head_keys:
            m[f"{arch}.attention.head_count_kv"] = 1
            m[f"{arch}.attention.key_length"] = a.kv_lora_rank + a.qk_rope_head_dim
            m[f"{arch}.attention.value_length"] = a.kv_lora_rank
            m[f"{arch}.attention.key_length_mla"] = a.head_dim
            m[f"{arch}.attention.value_length_mla"] = a.v_head_dim
    tensors = {"token_embd.weight": GgufTensor(type=1, shape=(a.hidden_size, a.vocab_size))}
    if not a.tie_embeddings:
        tensors["output.weight"] = GgufTensor(type=1, shape=(a.hidden_size, a.vocab_size))
    return GgufInfo(version=3, metadata=m, tensors=tensors,
                    array_lengths={"tokenizer.ggml.tokens": a.vocab_size})


GEMMA = architecture_from_config(load_config("gemma-3-270m"))
WEIGHTS = 24 << 20  # bytes of "weights" after each synthetic header


def gemma_gguf(*, tail: int = WEIGHTS, tokens: int = GEMMA.vocab_size) -> bytes:
    """A Gemma 3 270M Q4_K_M header (262,144 tokens: 2.3 MB) and ``tail`` bytes after it."""
    info = header_of(GEMMA)
    kv = {**info.metadata, "tokenizer.ggml.tokens": ["t"] * tokens}
    tensors = {n: (t.type, t.shape) for n, t in info.tensors.items()}
    return gguf_bytes(kv, tensors=tensors) + bytes(tail)
