"""Profile fingerprints survive the typed sizes, durations and sources.

The expected values were computed by llmgw before sizes, durations and sources
were parsed into typed values, when the fingerprint hashed the raw strings; a
change to either the hash or the encoding of these values would mark every
running replica stale on upgrade.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.catalog.decode import decode_yaml
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import Model

CASES = Path(__file__).with_name("fingerprint_cases.yaml")

# (model, profile) -> fingerprint, as computed by the earlier code from the same file.
EARLIER = {
    ("qwen-cpu", "cpu-8"): "sha256:a517d670e0342eb3",
    ("qwen-cpu", "cpu-small"): "sha256:cb36abf04f9dece8",
    ("llama-70b", "h100-2"): "sha256:e54ea74db6618630",
    ("llama-70b", "h100-4"): "sha256:de52d0f306125cac",
    ("gemma", "cpu"): "sha256:74aeba32d93e68fd",
    ("mirror-model", "cpu"): "sha256:d606f36a36a37d1a",
    ("local-path", "cpu"): "sha256:be88eb54aa57b588",
    ("file-url", "cpu"): "sha256:42fab1861d1b02b9",
}


def _models() -> dict[str, Model]:
    return {m.name: m for m in decode_yaml(CASES.read_bytes(), list[Model], source=str(CASES))}


@pytest.mark.parametrize(("model", "profile"), sorted(EARLIER))
def test_fingerprint_is_unchanged_by_typed_values(model: str, profile: str) -> None:
    """Every size spelling, duration and source form hashes as it did before it was typed."""
    m = _models()[model]
    p = m.profile(profile)
    assert p is not None
    assert fingerprint(m, p) == EARLIER[(model, profile)]


def test_spelling_of_a_size_is_part_of_the_fingerprint() -> None:
    """Sizes hash as written, so rewriting 192 GiB as 192GiB is an edit like any other."""
    m = _models()["llama-70b"]
    p = m.profile("h100-2")
    assert p is not None
    rewritten = decode_yaml(CASES.read_text().replace("192 GiB", "192GiB"), list[Model],
                            source="x")
    q = next(x for x in rewritten if x.name == "llama-70b").profile("h100-2")
    assert q is not None
    assert q.memory == p.memory
    assert fingerprint(m, p) != fingerprint(m, q)
