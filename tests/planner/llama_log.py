"""What llama.cpp (through llama-cpp-python) logs loading a model, read from a child process.

The tests that compare the planner's figures with llama.cpp's own run it in a
child and parse its stderr. The test process never imports llama_cpp, not even
to learn whether it is installed: the import loads libllama, and
llama_cpp/_utils.py opens two /dev/null files at module level that it never
closes, which surfaces as ResourceWarnings when this process exits.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def llama_cpp_log(**llama: str | int | bool) -> str:
    """The stderr of ``Llama(**llama)`` with verbose=True; skips where llama-cpp-python
    is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    script = f"from llama_cpp import Llama\nLlama(verbose=True, **{llama!r})\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stderr
