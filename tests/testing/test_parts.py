"""The fake's building blocks on their own: fixtures, schema, attributes, Go formatting.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.testing import default_fleet, node_4x_l40s_48g, node_8x_h100_80g, node_cpu_64c
from llmgw.testing.fake_nomad.attributes import (
    check_attribute,
    check_strings,
    parse_attribute,
    version_matches,
)
from llmgw.testing.fake_nomad.gotext import duration, multi
from llmgw.testing.fake_nomad.schema import REFERENCE, strip_annotation

REFERENCE_FILE = Path(__file__).resolve().parents[2] / "docs" / "nomad-api-fields.json"


def test_h100_fixture_matches_the_reference_shapes() -> None:
    """node_8x_h100_80g: 8 H100s by NVML name, 81559 MiB, GPU- UUIDs, 64 cores, fabric meta."""
    node = node_8x_h100_80g("gpu-h100-01", "ib-a")
    [gpus] = node.devices
    assert (gpus.vendor, gpus.type, gpus.name) == ("nvidia", "gpu", "NVIDIA H100 80GB HBM3")
    assert gpus.attributes["memory"] == {"Int": 81559, "Unit": "MiB"}
    assert len(gpus.instances) == 8
    assert all(i.id.startswith("GPU-") for i in gpus.instances)
    assert len(node.core_ids) == 64
    assert 1_000_000 < node.memory_mb < 1_100_000
    assert node.meta["llmgw_fabric"] == "ib-a"
    assert node.meta["llmgw_gpu_class"] == "h100-80g"
    assert node_8x_h100_80g("gpu-h100-01", "ib-a").id == node.id  # stable across builds


def test_other_fixtures_and_default_fleet() -> None:
    """L40S reports 46068 MiB; the CPU node has no GPU; the fleet is 3×H100, L40S, CPU."""
    l40s = node_4x_l40s_48g("gpu-l40s-01")
    assert l40s.devices[0].name == "NVIDIA L40S"
    assert len(l40s.devices[0].instances) == 4
    assert l40s.devices[0].attributes["memory"] == {"Int": 46068, "Unit": "MiB"}
    assert node_cpu_64c("cpu-01").devices == []
    assert len(node_cpu_64c("cpu-01").core_ids) == 64
    fleet = default_fleet()
    fabrics = sorted(n.meta.get("llmgw_fabric", "-") for n in fleet)
    assert fabrics == ["-", "-", "ib-a", "ib-a", "ib-b"]
    assert len({n.id for n in fleet}) == len({n.address for n in fleet}) == 5


def test_schema_matches_the_reference_field_list() -> None:
    """The decoder's struct table is the reference's, field for field and type for type."""
    reference = json.loads(REFERENCE_FILE.read_text())
    for struct, fields in REFERENCE.items():
        assert {k: strip_annotation(v) for k, v in reference[struct].items()} == fields, struct


@pytest.mark.parametrize(("op", "left", "right", "expected"), [
    (">=", {"Int": 81559, "Unit": "MiB"}, "40 GiB", True),
    (">=", {"Int": 81559, "Unit": "MiB"}, "80 GiB", False),
    (">=", {"Int": 46068, "Unit": "MiB"}, "40GiB", True),
    ("<", {"Int": 700, "Unit": "W"}, "1 kW", True),
    (">=", {"Int": 81559, "Unit": "MiB"}, "40 GHz", False),  # incomparable units
    ("=", {"String": "NVIDIA H100 80GB HBM3"}, "NVIDIA H100 80GB HBM3", True),
])
def test_device_attribute_comparison(op: str, left: dict[str, object], right: str,
                                     expected: bool) -> None:
    """Device constraints compare within a base unit, as psstructs.Attribute does (§2)."""
    from llmgw.testing.fake_nomad.attributes import attr_from_wire
    assert check_attribute(op, attr_from_wire(left), parse_attribute(right)) is expected


def test_node_constraint_ordering_and_versions() -> None:
    """Node targets order as ints, then floats, then strings; semver accepts a v prefix."""
    assert check_strings(">", "10", "9")
    assert not check_strings(">", "10a", "9a")
    assert check_strings("semver", "1.10.5", ">= 1.4.0")
    assert not check_strings("semver", None, ">= 1.8.0")
    assert version_matches("v1.5.1", ">= 0.4.0") is True
    assert version_matches("1.9.0-beta.1", ">= 1.9.0") is False
    assert version_matches("1.0", "garbage constraint") is None


def test_go_formatting() -> None:
    """Durations and multierrors print exactly as Go prints them."""
    assert [duration(n) for n in (0, 10, 1500, 500_000_000, 10**9, 1_500_000_000,
                                  300 * 10**9, 3600 * 10**9)] == [
        "0s", "10ns", "1.5µs", "500ms", "1s", "1.5s", "5m0s", "1h0m0s"]
    assert multi(["a"]) == "1 error occurred:\n\t* a\n\n"
    assert multi(["a", "b"]) == "2 errors occurred:\n\t* a\n\t* b\n\n"
