"""A GGUF file's header read as the config.json the planner reasons with.

Most llama.cpp models are single GGUF files in repositories that hold no
config.json, so the header is the only description of the network there is.
``config_from_gguf`` writes it as a config.json of the matching Hugging Face
``model_type`` (``architecture_from_config`` then applies the same rules as
to any checkpoint), and ``quantization_of`` names the file's mix the way the
planner does. Both are pure.

The keys are llama.cpp's own (src/llama-arch.cpp, ``LLM_KV_NAMES``; written by
convert_hf_to_gguf.py from the checkpoint's config), and where the header is
silent the values are those llama.cpp itself assumes when it loads the file
(src/llama-model.cpp, ``load_hparams``), because llama.cpp is the engine
that will run it:

* the key length defaults to ``embedding_length / head_count`` and the KV
  head count to the head count;
* the vocabulary is ``<arch>.vocab_size`` or the length of
  ``tokenizer.ggml.tokens``;
* the embedding is tied when the file has no ``output.weight`` tensor (the
  loader then duplicates ``token_embd`` as the output layer), unless the file
  is the first of a split model (``split.count``), which lists only its own;
* which layers slide is not in the file: Gemma 2 and gpt-oss alternate
  starting with a sliding layer (``set_swa_pattern(2)``), Gemma 3 slides five
  layers in six (``set_swa_pattern(6)``), Gemma 2's window defaults to 4096;
  Phi-3's window is switched off (llama.cpp runs it as full attention), and
  no other supported family has one;
* a Llama file with experts is Mixtral (llama.cpp reads both as ``llama``).

An architecture outside ``FAMILIES_BY_GGUF`` is refused with the families it
knows, as ``architecture_from_config`` refuses an unknown ``model_type``: the
numbers of a guessed architecture would look right and be wrong. A key the
family needs and the header lacks (or holds per layer, as an array) is an
error naming the key.
"""

from __future__ import annotations

from typing import Any

from llmgw.errors import DefinitionError
from llmgw.weights.gguf import GgufInfo

# general.architecture -> model_type (see arch.FAMILIES). "llama" turns into
# "mixtral" when the file has experts.
FAMILIES_BY_GGUF: dict[str, str] = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
    "phi3": "phi3", "deepseek2": "deepseek_v2", "gpt-oss": "gpt_oss", "gemma": "gemma",
    "gemma2": "gemma2", "gemma3": "gemma3_text",
}

# llama.cpp's enum llama_ftype (include/llama.h), the values general.file_type records.
LLAMA_FTYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}
# The mixes the planner has a row for. F16 weighs what BF16 does (two bytes a
# weight, the same tensors kept at f32), so it is planned as bf16. The others
# (Q4_K_S, the IQ types, Q3_K...) have no row and no name here.
PLANNED_FTYPES: dict[str, str] = {
    "F16": "bf16", "BF16": "bf16", "Q8_0": "q8_0", "Q6_K": "q6_K", "Q5_K_M": "q5_K_M",
    "Q4_K_M": "q4_K_M", "Q4_0": "q4_0", "MXFP4_MOE": "mxfp4",
}

_SWA_PATTERN = {"gemma2": 2, "gpt-oss": 2, "gemma3": 6}


def file_type_name(info: GgufInfo) -> str | None:
    """llama.cpp's name for the file's mix (``general.file_type``), None if not recorded."""
    ftype = info.metadata.get("general.file_type")
    if isinstance(ftype, bool) or not isinstance(ftype, int):
        return None
    return LLAMA_FTYPES.get(ftype, f"file type {ftype}")


def quantization_of(info: GgufInfo) -> str | None:
    """The planner's name for the file's mix, None when it has no row for it."""
    return PLANNED_FTYPES.get(file_type_name(info) or "")


class _Header:
    """The metadata of one architecture, read with errors that name the GGUF key."""

    def __init__(self, info: GgufInfo, arch: str, where: str) -> None:
        self.meta = info.metadata
        self.arch = arch
        self.where = where

    def get(self, suffix: str) -> int | None:
        value = self.meta.get(f"{self.arch}.{suffix}")
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value

    def need(self, suffix: str) -> int:
        value = self.get(suffix)
        if value is None:
            key = f"{self.arch}.{suffix}"
            raise DefinitionError(
                f"{self.where}: the GGUF header has no {key} (or holds it per layer, which "
                "the planner does not read); it cannot size this model", field=key)
        return value


def config_from_gguf(info: GgufInfo, *, where: str = "GGUF header") -> dict[str, Any]:
    """``info`` as a config.json for ``architecture_from_config``; DefinitionError if it
    is not an architecture the planner knows, or lacks a key it needs."""
    arch = info.architecture
    model_type = FAMILIES_BY_GGUF.get(arch or "")
    if arch is None or model_type is None:
        known = ", ".join(sorted(FAMILIES_BY_GGUF))
        raise DefinitionError(
            f"{where}: general.architecture {arch or '(missing)'!r} is an architecture the "
            f"planner cannot reason about; it knows {known}", field="general.architecture")
    h = _Header(info, arch, where)
    layers = h.need("block_count")
    hidden = h.need("embedding_length")
    heads = h.need("attention.head_count")
    vocab = h.get("vocab_size") or info.array_lengths.get("tokenizer.ggml.tokens")
    if not vocab:
        raise DefinitionError(f"{where}: the GGUF header has neither {arch}.vocab_size nor "
                              "tokenizer.ggml.tokens; it cannot size the embedding",
                              field="tokenizer.ggml.tokens")
    experts = h.get("expert_count") or 0
    if arch == "llama" and experts:
        model_type = "mixtral"
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": h.get("attention.head_count_kv") or heads,
        "head_dim": h.get("attention.key_length") or hidden // heads,
        "intermediate_size": h.get("feed_forward_length") or h.need("expert_feed_forward_length"),
        "vocab_size": vocab,
        "max_position_embeddings": h.need("context_length"),
    }
    split = info.metadata.get("split.count")
    if not (isinstance(split, int) and split > 1):
        # The first file of a split model holds only its own share of the tensors, so
        # a missing output.weight says nothing there; the family's default stands.
        cfg["tie_word_embeddings"] = "output.weight" not in info.tensors
    if arch in _SWA_PATTERN:
        window = h.get("attention.sliding_window") or (4096 if arch == "gemma2" else None)
        if window is None:
            window = h.need("attention.sliding_window")
        n = _SWA_PATTERN[arch]
        cfg["sliding_window"] = window
        # set_swa_pattern(n): layer il slides when il % n < n - 1.
        cfg["layer_types"] = ["sliding_attention" if i % n < n - 1 else "full_attention"
                              for i in range(layers)]
    if model_type in ("mixtral", "gpt_oss"):
        cfg["num_local_experts"] = h.need("expert_count")
        cfg["num_experts_per_tok"] = h.need("expert_used_count")
    elif model_type == "qwen3_moe":
        cfg["num_experts"] = h.need("expert_count")
        cfg["num_experts_per_tok"] = h.need("expert_used_count")
        cfg["moe_intermediate_size"] = h.need("expert_feed_forward_length")
    elif model_type == "deepseek_v2":
        cfg.update(_deepseek(h))
    return cfg


def _deepseek(h: _Header) -> dict[str, Any]:
    """Multi-head latent attention. Files converted since llama.cpp decompresses MLA at
    load time keep the per-head sizes in key_length_mla/value_length_mla (key_length
    then holds the latent); older ones in key_length/value_length."""
    rope = h.need("rope.dimension_count")
    key = h.get("attention.key_length_mla") or h.need("attention.key_length")
    value = h.get("attention.value_length_mla") or h.need("attention.value_length")
    return {
        "num_key_value_heads": h.need("attention.head_count"),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": key - rope,
        "v_head_dim": value,
        "kv_lora_rank": h.need("attention.kv_lora_rank"),
        "q_lora_rank": h.get("attention.q_lora_rank") or 0,
        "n_routed_experts": h.need("expert_count"),
        "num_experts_per_tok": h.need("expert_used_count"),
        "moe_intermediate_size": h.need("expert_feed_forward_length"),
        "n_shared_experts": h.get("expert_shared_count") or 0,
        "first_k_dense_replace": h.get("leading_dense_block_count") or 0,
    }
