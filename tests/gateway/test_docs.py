"""The gateway's README documents every metric it exports and every gateway setting."""

from __future__ import annotations

from pathlib import Path

from llmgw.config import GatewayConfig
from llmgw.gateway.metrics import GatewayMetrics

README = Path(__file__).resolve().parents[2] / "llmgw" / "gateway" / "README.md"


def test_every_metric_is_in_the_readme_table() -> None:
    """A metric added to GatewayMetrics without a README row fails here."""
    metrics = GatewayMetrics(lambda: [("m", 1, 0)])
    names = {family.name for family in metrics.registry.collect()}
    text = README.read_text()
    assert len(names) >= 14
    for name in names:   # a counter's family name drops its _total suffix
        assert f"`{name}`" in text or f"`{name}_total`" in text, f"{name} is not in {README}"

def test_every_gateway_setting_is_in_the_readme() -> None:
    """Each field of GatewayConfig has a row in the configuration table."""
    text = README.read_text()
    for field in GatewayConfig.__struct_fields__:
        assert f"| `{field}` |" in text, field


def test_the_capability_table_has_a_row_for_every_endpoint() -> None:
    """An endpoint added to the capability map without a row in the README's table fails here."""
    from llmgw.gateway.capabilities import ENDPOINT_CAPABILITY

    table = README.read_text().split("## Capabilities", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `/v1/")]
    for path in ENDPOINT_CAPABILITY:
        short = path.rsplit("/", 1)[-1]
        assert any(f"`{path}`" in row or f"`/{short}`" in row for row in rows), path


def test_the_engine_table_has_a_column_for_every_engine() -> None:
    """An engine added to llmgw.catalog.engines without its column in the README fails here."""
    from typing import get_args

    from llmgw.catalog.engines import DIALECTS, Engine

    table = README.read_text().split("beyond the request it forwards", 1)[1].split("\n\n", 2)[1]
    header = table.splitlines()[0]
    names = {"vllm": "vLLM", "llama.cpp": "llama.cpp", "sglang": "SGLang", "openai": "`openai`"}
    assert set(get_args(Engine)) == set(DIALECTS) == set(names)
    for engine in get_args(Engine):
        assert f"| {names[engine]} |" in header or f"| {names[engine]}" in header, engine
