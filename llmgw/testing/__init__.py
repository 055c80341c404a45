"""Test doubles llmgw ships so that its users can test their integrations too.

``FakeNomad`` is a Nomad server on loopback, built from the verified facts in
``docs/nomad-api.md`` rather than from llmgw's own assumptions: strict
about request shapes where Nomad would silently misread them, faithful in its answers,
defaults, status codes and error texts. See ``llmgw.testing.fake_nomad``.

``SimEngine`` is an inference engine with vLLM's HTTP face over a model of
its scheduler (batching, chunked prefill, a prefix cache per replica) and no
GPU, for testing and benchmarking routing and scaling settings on a laptop.
See ``llmgw.testing.simengine``.
"""

from __future__ import annotations

from llmgw.testing.fake_nomad import (
    FakeNomad,
    default_fleet,
    node_4x_l40s_48g,
    node_8x_h100_80g,
    node_cpu_64c,
)
from llmgw.testing.simengine import SimEngine, SimSpec

__all__ = ["FakeNomad", "SimEngine", "SimSpec", "default_fleet", "node_4x_l40s_48g",
           "node_8x_h100_80g", "node_cpu_64c"]
