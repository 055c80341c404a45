"""Bytes of every tensor in every quantisation, from the formats' own layouts.

GGUF types are blocks: q8_0 stores 32 weights in 34 bytes (an fp16 scale and
32 int8), q4_0 32 in 18, the K-quants 256 weights per super-block (q4_K 144
bytes, q5_K 176, q6_K 210), MXFP4 32 in 17 (ggml's ``type_size`` and
``blck_size``). A quantisation such as q4_K_M is not one type but a mix,
chosen per tensor by llama.cpp's quantizer (``llama_tensor_get_type`` in
src/llama-quant.cpp); ``gguf_type`` follows the rules that apply to the mixes
offered here:

* the output head (or, when embeddings are tied, the token embedding that
  doubles as it) is q6_K, unless the mix is q8_0 or the row length is not a
  multiple of 256, where it is q8_0;
* q4_K_M and q5_K_M put attn_v and ffn_down (experts' and shared experts'
  too) at q6_K in the layers ``use_more_bits`` picks: the first and last
  eighth and every third layer between, half the layers in all;
* a fused attn_qkv is q5_K in q4_K_M and q6_K in q5_K_M;
* an 80-layer Llama or Qwen2 ("70B") raises its remaining q4_K attn_v to q5_K;
  an eight-expert model (Mixtral) keeps attn_v and attn_k at q8_0 and, in
  q4_K_M, attn_output at q5_K;
* a row length the type's block does not divide falls back (q4_K to q5_0,
  q5_K to q5_1, q6_K to q8_0, anything still misfit to f16);
* norms, biases and the MoE router are not quantised (f32 in GGUF).

The vLLM formats: fp8 and int8 store each Linear of a decoder block in one
byte (plus a 4-byte scale per tensor, per output channel for int8, or per
128x128 block for block-quantised fp8 checkpoints such as DeepSeek-V3) and
keep embeddings, the head, norms and router at 16 bits. AWQ and GPTQ pack
4-bit weights eight to an int32 and add, per group of ``group_size`` inputs
and per output channel, a 16-bit scale and a 4-bit zero point; GPTQ adds an
int32 group index per input row. MXFP4 (gpt-oss's own checkpoint format)
stores the experts at 17 bytes per 32 weights and everything else at 16 bits.
"""

from __future__ import annotations

from typing import Literal

from llmgw.planner.arch import Architecture
from llmgw.planner.tensors import Tensor

# ggml type -> (weights per block, bytes per block)
GGML_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
    "q4_K": (256, 144), "q5_K": (256, 176), "q6_K": (256, 210), "mxfp4": (32, 17),
}

Format = Literal["gguf", "bf16", "fp8", "int8", "awq", "gptq", "mxfp4"]

# Every quantisation the planner knows, highest precision first. The value is
# the ggml type a GGUF mix starts from (None: not a GGUF mix).
QUANTIZATIONS: dict[str, str | None] = {
    "bf16": None, "fp8": None, "int8": None, "q8_0": "q8_0", "q6_K": "q6_K",
    "q5_K_M": "q5_K", "q4_K_M": "q4_K", "q4_0": "q4_0", "mxfp4": None, "awq": None,
    "gptq": None,
}
GGUF_QUANTS = ("q8_0", "q6_K", "q5_K_M", "q4_K_M", "q4_0")

# The fallback llama.cpp applies when a row length is not a multiple of the block.
_FALLBACK = {"q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0"}


def row_bytes(ggml_type: str, n: int) -> int:
    """ggml_row_size: bytes of a row of ``n`` values."""
    block, size = GGML_TYPES[ggml_type]
    return n // block * size


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers a K-quant M mix keeps at higher precision."""
    eighth = n_layers // 8
    return i_layer < eighth or i_layer >= 7 * n_layers // 8 or (i_layer - eighth) % 3 == 2


def _is_70b(a: Architecture) -> bool:
    """llama.cpp's LLM_TYPE_70B for the families it reads as llama or qwen2."""
    if a.num_layers != 80:
        return False
    if a.family == "llama":
        return a.num_kv_heads != a.num_heads  # equal heads is LLaMA-1 65B
    return a.family == "qwen2"


def gguf_type(t: Tensor, quant: str, a: Architecture) -> str:
    """The ggml type llama.cpp's quantizer gives ``t`` in mix ``quant``."""
    if not t.quantizable:
        return "f32"
    if quant == "bf16":
        return "bf16"
    base = "mxfp4" if quant == "mxfp4" else QUANTIZATIONS[quant]
    assert base is not None
    new = base
    role = t.role
    if role == "output" or (a.tie_embeddings and role == "token_embd"):
        if quant == "mxfp4" or t.cols % GGML_TYPES[new][0]:
            new = "q8_0"
        elif new != "q8_0":
            new = "q6_K"
    elif quant == "mxfp4":
        new = "mxfp4" if t.count > 1 else "q8_0"
    elif role == "attn_v":
        if quant in ("q4_K_M", "q5_K_M") and use_more_bits(t.layer, a.num_layers):
            new = "q6_K"
        if _is_70b(a) and new == "q4_K":
            new = "q5_K"
        if a.num_experts == 8:
            new = "q8_0"
    elif role == "attn_k":
        if a.num_experts == 8:
            new = "q8_0"
    elif role.startswith("ffn_down"):
        if quant in ("q4_K_M", "q5_K_M") and use_more_bits(t.layer, a.num_layers):
            new = "q6_K"
    elif role == "attn_output":
        if a.num_experts == 8 and quant == "q4_K_M":
            new = "q5_K"
    elif role == "attn_qkv":
        if quant == "q4_K_M":
            new = "q5_K"
        elif quant == "q5_K_M":
            new = "q6_K"
    if t.cols % GGML_TYPES[new][0]:
        new = _FALLBACK.get(new, "f16")
        if t.cols % GGML_TYPES[new][0]:
            new = "f16"
    return new


def _gguf_bytes(t: Tensor, quant: str, a: Architecture) -> int:
    return t.count * t.rows * row_bytes(gguf_type(t, quant, a), t.cols)


def _group_bytes(t: Tensor, group: int, *, gptq: bool) -> int:
    """AWQ/GPTQ: packed int4 weights, fp16 scales and int4 zeros per group."""
    groups = -(-t.cols // group)
    per = t.cols * t.rows // 2 + groups * t.rows * 2 + groups * t.rows // 2
    if gptq:
        per += t.cols * 4  # g_idx
    return t.count * per


def tensor_bytes(t: Tensor, quant: str, a: Architecture, fmt: Format) -> int:
    """Bytes of ``t`` when the model is stored as ``quant`` in container ``fmt``."""
    if fmt == "gguf":
        return _gguf_bytes(t, quant, a)
    n = t.params
    if not t.linear:
        return n * 2
    if quant == "bf16":
        return n * 2
    if quant in ("fp8", "int8"):
        if quant == "fp8" and a.checkpoint_format == "fp8":
            # block-quantised fp8 checkpoints carry an fp32 scale per 128x128 block
            return n + t.count * (-(-t.rows // 128)) * (-(-t.cols // 128)) * 4
        scales = t.count * t.rows * 4 if quant == "int8" else 4
        return n + scales
    if quant in ("awq", "gptq"):
        return _group_bytes(t, a.quant_group_size, gptq=quant == "gptq")
    if quant == "mxfp4":
        return n * 17 // 32 if t.count > 1 else n * 2
    raise ValueError(f"unknown quantisation {quant!r}")


_CONTAINERS: dict[str, Format] = {"bf16": "bf16", "fp8": "fp8", "int8": "int8", "awq": "awq",
                                  "gptq": "gptq", "mxfp4": "mxfp4"}


def container(quant: str, *, gguf_engine: bool) -> Format:
    """The file format ``quant`` is stored in: GGUF on llama.cpp and for the GGUF mixes."""
    if gguf_engine or quant in GGUF_QUANTS:
        return "gguf"
    return _CONTAINERS[quant]


def weights_by_tensor(inv: list[Tensor], quant: str, a: Architecture, fmt: Format,
                      ) -> list[int]:
    return [tensor_bytes(t, quant, a, fmt) for t in inv]
