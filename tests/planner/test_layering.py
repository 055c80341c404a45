"""The planner's decisions are pure: only inputs.py may reach files or the Hub."""

from __future__ import annotations

import subprocess
import sys

DECISIONS = ["arch", "gguf", "tensors", "quant", "memory", "candidates", "plan", "reserve"]
IO_LIBRARIES = ["huggingface_hub", "httpx", "litestar", "psycopg", "sqlite3", "nomad",
                "aiohttp", "requests", "urllib3", "socket"]


def test_decision_modules_import_no_io_library() -> None:
    """Importing every decision module loads none of the I/O libraries."""
    script = (
        "import sys\n"
        + "".join(f"import llmgw.planner.{m}\n" for m in DECISIONS)
        + f"print(','.join(sorted(set({IO_LIBRARIES!r}) & set(sys.modules))))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == ""
