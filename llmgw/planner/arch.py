"""A model's ``config.json`` read into the numbers the planner reasons with.

The architecture is read, never typed: the layer count, the KV head count
(attention heads in its place is the classic slip, a factor of five on a
grouped-query model), the head size (given explicitly, as Qwen3, Gemma and
gpt-oss do, or derived as hidden/heads), the sliding-window layout, the
experts and the latent KV of multi-head latent attention.

A configuration is recognised by its ``model_type`` (or, lacking one, its
``architectures`` entry). One that is not in ``FAMILIES`` is refused with a
message saying so: treating an unknown model as Llama would produce numbers
that look right and are not, which is worse than no numbers. A key that the
family needs and the file lacks is an error naming the key; defaults are used
only where Hugging Face's own config class defines them and the value is not a
shape that varies between sizes of the model.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from llmgw.errors import DefinitionError

LayerKind = Literal["full", "sliding"]

# model_type -> family. A family fixes which tensors a layer holds and how
# engines treat its attention; several model_types share one.
FAMILIES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "mixtral": "mixtral",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "gpt_oss": "gpt_oss",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
}

_ARCH_TO_TYPE = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3",
}

# Defaults from the Hugging Face config classes for keys that released
# checkpoints sometimes omit (Gemma 3's multimodal config.json leaves most of
# its text_config to the class). Shapes that differ between sizes of a family
# (layers, heads, widths) are never defaulted.
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"tie_word_embeddings": True, "head_dim": 256},
    "gemma2": {"tie_word_embeddings": True, "sliding_window": 4096, "head_dim": 256},
    "gemma3": {"tie_word_embeddings": True, "vocab_size": 262208, "sliding_window": 4096,
               "sliding_window_pattern": 6, "max_position_embeddings": 131072,
               "head_dim": 256},
}


class Architecture(msgspec.Struct, frozen=True, kw_only=True):
    """The shape of a decoder-only model, as far as memory is concerned.

    ``head_dim``/``v_head_dim`` are the query-key and value head sizes;
    for multi-head latent attention ``kv_lora_rank + qk_rope_head_dim`` is
    what is cached per token and layer instead. ``layer_kinds[i]`` says
    whether layer ``i`` attends over a sliding window of ``sliding_window``
    tokens. ``dense_layers`` lists the layers of a mixture-of-experts model
    that have a plain feed-forward block instead of experts.
    """

    model_type: str
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    max_position_embeddings: int
    layer_kinds: list[LayerKind]
    sliding_window: int | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    dense_layers: list[int] = []
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    checkpoint_format: str = "bf16"
    quant_group_size: int = 128

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def sliding_layers(self) -> int:
        return sum(1 for k in self.layer_kinds if k == "sliding")


def _int(cfg: dict[str, Any], key: str, where: str, *, default: int | None = None,
         minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise DefinitionError(
            f"{where}: {key} is missing; the planner reads layer and head counts from the "
            "model's own config.json and never guesses them. Check that this is the "
            "model's config.json (a full checkpoint, not an adapter)",
            field=key,
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise DefinitionError(f"{where}: {key} must be an integer, got {value!r}", field=key)
    if value < minimum:
        raise DefinitionError(f"{where}: {key} must be at least {minimum}, got {value}",
                              field=key)
    return value


def _model_type(cfg: dict[str, Any]) -> str:
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type
    for arch in cfg.get("architectures") or []:
        if arch in _ARCH_TO_TYPE:
            return _ARCH_TO_TYPE[arch]
    return ""


def _checkpoint_format(cfg: dict[str, Any]) -> tuple[str, int]:
    """The format the checkpoint's weights are stored in, and its quantisation group size."""
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method", "")).lower()
        group = qc.get("group_size")
        group_size = group if isinstance(group, int) and group > 0 else 128
        if method in ("fp8", "mxfp4", "awq", "gptq"):
            return method, group_size
        if method:
            return method, group_size
    return "bf16", 128


def _layer_kinds(cfg: dict[str, Any], family: str, n_layers: int, where: str,
                 ) -> tuple[list[LayerKind], int | None]:
    """Which layers use a sliding window, as the model's own code decides it."""
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or not isinstance(window, int) or window <= 0:
        # Qwen2/2.5/3 publish a sliding_window but switch it off with
        # use_sliding_window: false; reading the window alone would cap their
        # cache at it.
        return ["full"] * n_layers, None
    types = cfg.get("layer_types")
    if isinstance(types, list):
        if len(types) != n_layers:
            raise DefinitionError(
                f"{where}: layer_types has {len(types)} entries for {n_layers} layers",
                field="layer_types")
        kinds: list[LayerKind] = []
        for i, t in enumerate(types):
            if t == "sliding_attention":
                kinds.append("sliding")
            elif t == "full_attention":
                kinds.append("full")
            else:
                raise DefinitionError(
                    f"{where}: layer_types[{i}] is {t!r}; the planner knows "
                    "sliding_attention and full_attention only", field=f"layer_types[{i}]")
        return kinds, window
    if family == "gemma2":
        # Gemma 2 alternates, starting with a sliding layer (even layers slide).
        return ["sliding" if i % 2 == 0 else "full" for i in range(n_layers)], window
    if family == "gemma3":
        pattern = _int(cfg, "sliding_window_pattern", where, default=6)
        return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(n_layers)], window
    if family == "qwen2" and cfg.get("use_sliding_window") is True:
        first = _int(cfg, "max_window_layers", where, default=n_layers, minimum=0)
        return ["sliding" if i >= first else "full" for i in range(n_layers)], window
    # Mistral 7B v0.1 and Phi-3 name one window for every layer.
    return ["sliding"] * n_layers, window


def architecture_from_config(raw: dict[str, Any], *, source: str = "config.json",
                             ) -> Architecture:
    """Read a decoded config.json; DefinitionError naming the key when it cannot be used."""
    if not isinstance(raw, dict):
        raise DefinitionError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    model_type = _model_type(raw)
    cfg = raw
    if model_type == "gemma3" and isinstance(raw.get("text_config"), dict):
        # The multimodal Gemma 3 keeps the language model under text_config;
        # the vision tower is counted by the parameter total, not here.
        cfg = {**raw["text_config"], "quantization_config": raw.get("quantization_config")}
    family = FAMILIES.get(model_type)
    if family is None:
        archs = ", ".join(raw.get("architectures") or []) or "none given"
        known = ", ".join(sorted(FAMILIES))
        raise DefinitionError(
            f"{source}: model_type {model_type or '(missing)'!r} (architectures: {archs}) is "
            f"an architecture the planner cannot reason about; it knows {known}. It does "
            "not treat an unknown model as Llama, because the numbers would look right "
            "and be wrong", field="model_type")
    defaults = _CLASS_DEFAULTS.get(family, {})
    cfg = {**defaults, **{k: v for k, v in cfg.items() if v is not None}}
    where = source

    hidden = _int(cfg, "hidden_size", where)
    n_layers = _int(cfg, "num_hidden_layers", where)
    heads = _int(cfg, "num_attention_heads", where)
    # Hugging Face's convention: a config without num_key_value_heads is
    # multi-head attention (one KV head per query head).
    kv_heads = _int(cfg, "num_key_value_heads", where, default=heads)
    vocab = _int(cfg, "vocab_size", where)
    if heads % kv_heads:
        raise DefinitionError(
            f"{where}: num_attention_heads ({heads}) is not a multiple of "
            f"num_key_value_heads ({kv_heads})", field="num_key_value_heads")
    explicit_head_dim = cfg.get("head_dim")
    head_dim = (_int(cfg, "head_dim", where) if explicit_head_dim is not None
                else hidden // heads)
    if explicit_head_dim is None and hidden % heads:
        raise DefinitionError(
            f"{where}: head_dim is not given and hidden_size ({hidden}) is not a multiple of "
            f"num_attention_heads ({heads})", field="head_dim")
    kinds, window = _layer_kinds(cfg, family, n_layers, where)
    fmt, group = _checkpoint_format(cfg)
    default_tie = family in ("gemma", "gemma2", "gemma3")
    fields: dict[str, Any] = {
        "model_type": model_type,
        "family": family,
        "hidden_size": hidden,
        "num_layers": n_layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "v_head_dim": head_dim,
        "intermediate_size": _int(cfg, "intermediate_size", where),
        "vocab_size": vocab,
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", default_tie)),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", where),
        "layer_kinds": kinds,
        "sliding_window": window,
        "attention_bias": bool(cfg.get("attention_bias", family in ("qwen2", "gpt_oss"))),
        "qk_norm": family in ("qwen3", "qwen3_moe", "gemma3"),
        "checkpoint_format": fmt,
        "quant_group_size": group,
    }
    if family in {"mixtral", "gpt_oss"}:
        fields["num_experts"] = _int(cfg, "num_local_experts", where)
        fields["experts_per_token"] = _int(
            cfg, "num_experts_per_tok", where, default=cfg.get("experts_per_token"))
        fields["moe_intermediate_size"] = fields["intermediate_size"]
    elif family == "qwen3_moe":
        fields["num_experts"] = _int(cfg, "num_experts", where)
        fields["experts_per_token"] = _int(cfg, "num_experts_per_tok", where)
        fields["moe_intermediate_size"] = _int(cfg, "moe_intermediate_size", where)
        step = _int(cfg, "decoder_sparse_step", where, default=1)
        only_mlp = {int(i) for i in cfg.get("mlp_only_layers") or []}
        fields["dense_layers"] = [i for i in range(n_layers)
                                  if i in only_mlp or (i + 1) % step != 0]
    elif family == "deepseek":
        fields.update(_deepseek(cfg, where, n_layers))
    return Architecture(**fields)


def _deepseek(cfg: dict[str, Any], where: str, n_layers: int) -> dict[str, Any]:
    """Multi-head latent attention and DeepSeek's shared-plus-routed experts."""
    nope = _int(cfg, "qk_nope_head_dim", where)
    rope = _int(cfg, "qk_rope_head_dim", where)
    first_dense = _int(cfg, "first_k_dense_replace", where, default=0, minimum=0)
    freq = _int(cfg, "moe_layer_freq", where, default=1)
    return {
        "head_dim": nope + rope,
        "v_head_dim": _int(cfg, "v_head_dim", where),
        "kv_lora_rank": _int(cfg, "kv_lora_rank", where),
        "q_lora_rank": _int(cfg, "q_lora_rank", where, default=0, minimum=0),
        "qk_rope_head_dim": rope,
        "num_experts": _int(cfg, "n_routed_experts", where),
        "experts_per_token": _int(cfg, "num_experts_per_tok", where),
        "moe_intermediate_size": _int(cfg, "moe_intermediate_size", where),
        "shared_experts": _int(cfg, "n_shared_experts", where, default=0, minimum=0),
        "dense_layers": [i for i in range(n_layers) if i < first_dense or i % freq != 0],
    }
