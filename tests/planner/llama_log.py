"""What llama.cpp (through llama-cpp-python) logs loading a model, read from a child process.

The tests that compare the planner's figures with llama.cpp's own run it in a
child and parse its stderr. The test process never imports llama_cpp, not even
to learn whether it is installed: the import loads libllama, and
llama_cpp/_utils.py opens two /dev/null files at module level that it never
closes, which surfaces as ResourceWarnings when this process exits.

Where the weights go depends on the CPU, so a test reads it from the log
(``weight_buffers``) rather than guessing it from the CPU's flags. The CPU
backend offers "extra" buffer types ahead of its plain one
(ggml-cpu/ggml-cpu.cpp, ggml_backend_cpu_get_extra_buffer_types): AMX where
llama.cpp was built for an AMX CPU, then the repacking buffer (CPU_REPACK,
formerly CPU_AARCH64). The loader gives each tensor the first buffer type
that supports its op (src/llama-model.cpp, select_weight_buft); both extras
take only 2-D matrix products, and only of the types they have kernels for on
this CPU (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type: q4_0,
q4_K and iq4_nl with AVX2, q2_K with AVX-512, q4_0 and iq4_nl on ARM with
dot-product or int8-matmul; amx/common.h, qtype_has_amx_kernels). Each
tensor an extra buffer rewrites is logged by name as it is loaded.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

MiB = 1024**2


def llama_cpp_log(**llama: str | int | bool) -> str:
    """The stderr of ``Llama(**llama)`` with verbose=True; skips where llama-cpp-python
    is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    script = f"from llama_cpp import Llama\nLlama(verbose=True, **{llama!r})\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stderr


# llama-model-loader.cpp (print_info): the bytes of the file's tensors.
_FILE_SIZE = re.compile(r"print_info: file size += ([\d.]+) MiB")
# llama-model.cpp (load_tensors): one line per buffer the weights were loaded into.
_BUFFER = re.compile(r"load_tensors: +(\w+) model buffer size = +([\d.]+) MiB")
# repack.cpp (repack) and amx.cpp (ggml_backend_amx_buffer_set_tensor), at debug level;
# progress dots may precede them on the line.
_REPACKED = re.compile(r"(?:repack: repack tensor (\S+) with"
                       r"|amx_buffer_set_tensor: amx repack tensor (\S+) of type)")
# Each figure is printed to 0.01 MiB.
_ROUNDING = 0.005 * MiB


@dataclass(frozen=True)
class WeightBuffers:
    """Where llama.cpp's load log says a model's weights went."""

    file_bytes: int
    buffers: dict[str, int]  # buffer type ("CPU", "CPU_REPACK", "AMX", ...) -> bytes
    repacked: frozenset[str]  # tensors an extra buffer rewrote into its own layout

    @property
    def total(self) -> int:
        return sum(self.buffers.values())

    def tolerance(self) -> int:
        """How far the sums of printed figures can be from the true sums."""
        return int(_ROUNDING * (len(self.buffers) + 1))


def weight_buffers(log: str) -> WeightBuffers:
    """The file's size, each weight buffer's size and the repacked tensors in a load log."""
    (file_mib,) = _FILE_SIZE.findall(log)
    buffers = {name: round(float(mib) * MiB) for name, mib in _BUFFER.findall(log)}
    if not buffers:
        raise ValueError("no 'model buffer size' line: was the log taken with verbose=True?")
    repacked = frozenset(a or b for a, b in _REPACKED.findall(log))
    return WeightBuffers(round(float(file_mib) * MiB), buffers, repacked)


def embedding_copies_named(w: WeightBuffers) -> int:
    """Copies of a tied embedding the log's placement implies: the file's one, which stays
    in the plain CPU buffer for the input lookup (GET_ROWS, which no extra buffer takes),
    and a second when an extra buffer repacked token_embd as the output layer (the loader
    reuses a duplicated tensor only within one buffer type)."""
    return 2 if "token_embd.weight" in w.repacked else 1


def embedding_copies_sized(w: WeightBuffers, embedding: int) -> int:
    """Copies of an embedding of ``embedding`` bytes the buffer sizes can hold beside the
    file's other tensors; a repacked copy is never smaller than the original (the layouts
    interleave blocks, AMX's adds per-row sums), so this counts each one."""
    beside = w.file_bytes - embedding
    return (w.total - beside + w.tolerance()) // embedding
