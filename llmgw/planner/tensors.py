"""Every weight tensor of a model, and how each engine spreads it over GPUs.

Weights are counted tensor by tensor rather than as parameters times a
width, because the formats do not treat tensors alike: llama.cpp's K-quant
"M" mixes keep attn_v and ffn_down at higher precision in half the layers,
fp8 and AWQ leave the embeddings and the router in 16 bits, and a tensor
whose row length is not a multiple of the block size falls back to another
type. The names are llama.cpp's GGUF tensor roles, since its mix rules match
on them.

How a tensor is split across tensor-parallel ranks follows vLLM's layers:
column-parallel projections split their outputs, row-parallel ones their
inputs, the vocabulary is padded to a multiple of 64 and split, and K/V
projections are replicated when there are fewer KV heads than ranks. MLA's
down-projections are replicated on every rank. llama.cpp does not split
tensors; it places whole layers on devices and keeps the token embedding in
host memory. A model with tied embeddings has no ``output`` tensor here, as
its GGUF file has none; llama.cpp loads a second copy of ``token_embd`` as
the output layer, which memory.py places.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmgw.planner.arch import Architecture

Split = Literal["col", "row", "kv", "vocab", "replicated", "experts"]

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor. ``cols`` is the row length (ggml's ne[0], the input width)."""

    role: str
    layer: int
    cols: int
    rows: int
    count: int = 1
    split: Split = "replicated"
    # A 2-D weight that the formats quantise (norms, biases and the MoE
    # router are kept in high precision by every format).
    quantizable: bool = True
    # A Linear inside a decoder block: what fp8, int8, AWQ and GPTQ quantise.
    # Embeddings and the output head stay 16-bit in those formats.
    linear: bool = True

    @property
    def params(self) -> int:
        return self.cols * self.rows * self.count


def _vec(role: str, layer: int, n: int, split: Split = "replicated") -> Tensor:
    return Tensor(role, layer, n, 1, split=split, quantizable=False, linear=False)


def _attention(a: Architecture, i: int) -> list[Tensor]:
    h, d, heads, kv = a.hidden_size, a.head_dim, a.num_heads, a.num_kv_heads
    out: list[Tensor] = []
    if a.is_mla:
        return _mla(a, i)
    if a.family == "phi3":
        # Phi-3 ships q, k and v fused (qkv_proj); GGUF keeps them as attn_qkv.
        out.append(Tensor("attn_qkv", i, h, (heads + 2 * kv) * d, split="col"))
    else:
        out.append(Tensor("attn_q", i, h, heads * d, split="col"))
        out.append(Tensor("attn_k", i, h, kv * d, split="kv"))
        out.append(Tensor("attn_v", i, h, kv * d, split="kv"))
    out.append(Tensor("attn_output", i, heads * d, h, split="row"))
    if a.attention_bias:
        out += [_vec("attn_q.bias", i, heads * d, "col"), _vec("attn_k.bias", i, kv * d, "col"),
                _vec("attn_v.bias", i, kv * d, "col")]
        if a.family == "gpt_oss":
            out.append(_vec("attn_output.bias", i, h))
    if a.qk_norm:
        out += [_vec("attn_q_norm", i, d), _vec("attn_k_norm", i, d)]
    if a.family == "gpt_oss":
        out.append(_vec("attn_sinks", i, heads, "col"))
    return out


def _mla(a: Architecture, i: int) -> list[Tensor]:
    """DeepSeek V2/V3 multi-head latent attention."""
    h, heads = a.hidden_size, a.num_heads
    nope = a.head_dim - a.qk_rope_head_dim
    out: list[Tensor] = []
    if a.q_lora_rank:
        out.append(Tensor("attn_q_a", i, h, a.q_lora_rank, split="replicated"))
        out.append(_vec("attn_q_a_norm", i, a.q_lora_rank))
        out.append(Tensor("attn_q_b", i, a.q_lora_rank, heads * a.head_dim, split="col"))
    else:
        out.append(Tensor("attn_q", i, h, heads * a.head_dim, split="col"))
    out.append(Tensor("attn_kv_a_mqa", i, h, a.kv_lora_rank + a.qk_rope_head_dim,
                      split="replicated"))
    out.append(_vec("attn_kv_a_norm", i, a.kv_lora_rank))
    out.append(Tensor("attn_kv_b", i, a.kv_lora_rank, heads * (nope + a.v_head_dim), split="col"))
    out.append(Tensor("attn_output", i, heads * a.v_head_dim, h, split="row"))
    return out


def _ffn(a: Architecture, i: int) -> list[Tensor]:
    h = a.hidden_size
    if not a.is_moe or i in a.dense_layers:
        f = a.intermediate_size
        if a.family == "phi3":
            # gate and up fused into one gate_up_proj (GGUF: ffn_up of twice the width).
            return [Tensor("ffn_up", i, h, 2 * f, split="col"),
                    Tensor("ffn_down", i, f, h, split="row")]
        return [Tensor("ffn_gate", i, h, f, split="col"), Tensor("ffn_up", i, h, f, split="col"),
                Tensor("ffn_down", i, f, h, split="row")]
    e, f = a.num_experts, a.moe_intermediate_size
    out = [Tensor("ffn_gate_inp", i, h, e, split="replicated", quantizable=False, linear=False),
           Tensor("ffn_gate_exps", i, h, f, e, split="experts"),
           Tensor("ffn_up_exps", i, h, f, e, split="experts"),
           Tensor("ffn_down_exps", i, f, h, e, split="experts")]
    if a.family == "gpt_oss":
        out += [_vec("ffn_gate_inp.bias", i, e),
                Tensor("ffn_gate_exps.bias", i, f, e, split="experts", quantizable=False,
                       linear=False),
                Tensor("ffn_up_exps.bias", i, f, e, split="experts", quantizable=False,
                       linear=False),
                Tensor("ffn_down_exps.bias", i, h, e, split="experts", quantizable=False,
                       linear=False)]
    if a.family == "deepseek":
        if a.model_type == "deepseek_v3":
            out.append(_vec("exp_probs_b", i, e))
        if a.shared_experts:
            s = a.shared_experts * f
            out += [Tensor("ffn_gate_shexp", i, h, s, split="col"),
                    Tensor("ffn_up_shexp", i, h, s, split="col"),
                    Tensor("ffn_down_shexp", i, s, h, split="row")]
    return out


def _norms(a: Architecture, i: int) -> list[Tensor]:
    h = a.hidden_size
    out = [_vec("attn_norm", i, h), _vec("ffn_norm", i, h)]
    if a.family in ("gemma2", "gemma3"):
        out += [_vec("post_attention_norm", i, h), _vec("post_ffw_norm", i, h)]
    return out


def inventory(a: Architecture) -> list[Tensor]:
    """All tensors, in llama.cpp's order: globals first, then layer by layer."""
    h = a.hidden_size
    out = [Tensor("token_embd", -1, h, a.vocab_size, split="vocab", linear=False),
           _vec("output_norm", -1, h)]
    for i in range(a.num_layers):
        out += _norms(a, i)
        out += _attention(a, i)
        out += _ffn(a, i)
    if not a.tie_embeddings:
        # Placed with the last layer's device by llama.cpp ("layer n_layer").
        out.append(Tensor("output", a.num_layers, h, a.vocab_size, split="vocab", linear=False))
    return out


def rank_fraction(t: Tensor, a: Architecture, tp: int) -> float:
    """The share of ``t`` one of ``tp`` vLLM tensor-parallel ranks holds."""
    if tp == 1 or t.split == "replicated":
        return 1.0
    if t.split == "kv":
        per_rank = max(1, a.num_kv_heads // tp)
        return per_rank / a.num_kv_heads
    if t.split == "vocab":
        padded = -(-a.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        per_rank = -(-padded // tp)
        return per_rank / a.vocab_size
    return 1.0 / tp


def layer_devices(n_layers: int, devices: int) -> list[int]:
    """llama.cpp's layer split over identical devices: device of layers 0..n_layers.

    Index ``n_layers`` is the output layer. llama.cpp splits by the fraction
    ``il / (n_layers + 1)`` against cumulative equal shares when every layer is
    offloaded, so the output head lands on the last device.
    """
    total = n_layers + 1
    bounds = [(d + 1) / devices for d in range(devices)]
    out: list[int] = []
    for il in range(total):
        frac = il / total
        dev = next((d for d, b in enumerate(bounds) if frac < b), devices - 1)
        out.append(dev)
    return out
