"""Test doubles llmgw ships so that its users can test their integrations too.

``FakeNomad`` is a Nomad server on loopback, built from the verified facts in
``docs/nomad-api.md`` rather than from llmgw's own assumptions: strict
about request shapes where Nomad would silently misread them, faithful in its answers,
defaults, status codes and error texts. See ``llmgw.testing.fake_nomad``.
"""

from __future__ import annotations

from llmgw.testing.fake_nomad import (
    FakeNomad,
    default_fleet,
    node_4x_l40s_48g,
    node_8x_h100_80g,
    node_cpu_64c,
)

__all__ = ["FakeNomad", "default_fleet", "node_4x_l40s_48g", "node_8x_h100_80g",
           "node_cpu_64c"]
