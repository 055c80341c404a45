"""config.json -> Architecture: every family read, nothing guessed."""

from __future__ import annotations

import pytest

from llmgw.errors import DefinitionError
from llmgw.planner.arch import architecture_from_config
from llmgw.planner.tensors import inventory
from tests.planner.fixtures import MODELS, load_config


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inventory_matches_published_parameter_count(name: str) -> None:
    """The tensors read from each real config.json add up to the model's published count."""
    a = architecture_from_config(load_config(name))
    n = sum(t.params for t in inventory(a))
    published = MODELS[name].params
    assert published is not None
    if name == "deepseek-v3":
        # 61 layers of config.json = the 671B model; the Hub total adds the MTP layer.
        assert n == pytest.approx(671e9, rel=0.001)
        assert published > n
    elif name == "gemma-3-27b-it":
        # The Hub total adds the vision tower that config.json's text_config does not describe.
        assert 0.3e9 < published - n < 0.5e9
    else:
        assert n == pytest.approx(published, rel=0.0005)


def test_grouped_query_attention_reads_kv_heads_not_attention_heads() -> None:
    """Llama-3.3-70B has 64 query heads but caches 8: the planner reads the 8."""
    a = architecture_from_config(load_config("llama-3.3-70b-instruct"))
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == (64, 8, 128)


def test_explicit_head_dim_wins_over_hidden_over_heads() -> None:
    """Qwen3-32B's head_dim 128 is used although hidden/heads would be 80."""
    a = architecture_from_config(load_config("qwen3-32b"))
    assert a.hidden_size // a.num_heads == 80
    assert a.head_dim == 128


def test_head_dim_derived_when_absent() -> None:
    """Phi-3 gives no head_dim: 3072 / 32 = 96, and all 32 heads are KV heads (MHA)."""
    a = architecture_from_config(load_config("phi-3-mini-4k-instruct"))
    assert (a.head_dim, a.num_kv_heads) == (96, 32)


def test_qwen_window_switched_off_is_not_a_window() -> None:
    """Qwen2.5 publishes sliding_window 131072 with use_sliding_window false: no window."""
    a = architecture_from_config(load_config("qwen2.5-14b-instruct"))
    assert a.sliding_window is None
    assert a.sliding_layers == 0


def test_mistral_window_covers_every_layer() -> None:
    """Mistral 7B v0.1 names one window of 4096 for all 32 layers."""
    a = architecture_from_config(load_config("mistral-7b-v0.1"))
    assert a.sliding_window == 4096
    assert a.sliding_layers == 32


def test_gemma2_alternates_starting_with_a_sliding_layer() -> None:
    """Gemma 2: even layers slide, odd layers attend fully; embeddings are tied."""
    a = architecture_from_config(load_config("gemma-2-9b-it"))
    assert a.layer_kinds[:4] == ["sliding", "full", "sliding", "full"]
    assert a.tie_embeddings


def test_gemma3_multimodal_reads_text_config_and_class_defaults() -> None:
    """Gemma 3 27B: text_config read, 5:1 pattern gives 10 full layers of 62, defaults filled."""
    a = architecture_from_config(load_config("gemma-3-27b-it"))
    assert a.num_layers == 62
    assert a.layer_kinds.count("full") == 10
    assert a.layer_kinds[5] == "full"
    assert a.layer_kinds[0] == "sliding"
    assert (a.vocab_size, a.max_position_embeddings, a.sliding_window) == (262208, 131072, 1024)
    assert a.tie_embeddings


def test_gpt_oss_layer_types_and_experts() -> None:
    """gpt-oss-120b: alternating 128-token window, 128 experts with 4 active, MXFP4 checkpoint."""
    a = architecture_from_config(load_config("gpt-oss-120b"))
    assert a.sliding_window == 128
    assert a.sliding_layers == 18
    assert (a.num_experts, a.experts_per_token, a.head_dim) == (128, 4, 64)
    assert a.checkpoint_format == "mxfp4"


def test_deepseek_latent_attention_and_dense_first_layers() -> None:
    """DeepSeek-V3: MLA latent 512+64, first three layers dense, one shared expert."""
    a = architecture_from_config(load_config("deepseek-v3"))
    assert a.is_mla
    assert (a.kv_lora_rank, a.qk_rope_head_dim) == (512, 64)
    assert a.dense_layers == [0, 1, 2]
    assert (a.num_experts, a.shared_experts, a.checkpoint_format) == (256, 1, "fp8")


def test_moe_every_expert_resident() -> None:
    """Mixtral's 8 experts are all counted, not the 2 active ones."""
    a = architecture_from_config(load_config("mixtral-8x7b-instruct-v0.1"))
    experts = sum(t.params for t in inventory(a) if t.role.endswith("_exps"))
    assert experts == 32 * 8 * 3 * 4096 * 14336


def test_unknown_architecture_is_reported_not_treated_as_llama() -> None:
    """A model_type the planner does not know is refused by name."""
    cfg = {**load_config("llama-3.1-8b-instruct"), "model_type": "falcon_mamba",
           "architectures": ["FalconMambaForCausalLM"]}
    with pytest.raises(DefinitionError, match="falcon_mamba.*cannot reason about") as err:
        architecture_from_config(cfg)
    assert "Llama" in err.value.message


def test_missing_head_count_names_the_key() -> None:
    """A config without num_attention_heads is an error naming that key."""
    cfg = load_config("llama-3.1-8b-instruct")
    del cfg["num_attention_heads"]
    with pytest.raises(DefinitionError, match="num_attention_heads is missing") as err:
        architecture_from_config(cfg)
    assert err.value.field == "num_attention_heads"


def test_heads_not_multiple_of_kv_heads_is_refused() -> None:
    """num_attention_heads must be a multiple of num_key_value_heads."""
    cfg = {**load_config("llama-3.1-8b-instruct"), "num_key_value_heads": 5}
    with pytest.raises(DefinitionError, match="not a multiple of num_key_value_heads"):
        architecture_from_config(cfg)


def test_non_integer_and_zero_sizes_are_refused() -> None:
    """A zero or non-integer layer count is an error naming the key."""
    with pytest.raises(DefinitionError, match="num_hidden_layers must be at least 1"):
        architecture_from_config({**load_config("llama-3.1-8b-instruct"),
                                  "num_hidden_layers": 0})
    with pytest.raises(DefinitionError, match="hidden_size must be an integer"):
        architecture_from_config({**load_config("llama-3.1-8b-instruct"),
                                  "hidden_size": "4096"})
