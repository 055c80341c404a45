"""A fake Nomad: the one partner the Nomad backend's tests have.

No Nomad binary runs where llmgw is tested, so this package stands in for a cluster:
a real HTTP server (``server``, ``routes_jobs``, ``routes_cluster``), Go-compatible
request decoding with a strict mode (``decode``, ``schema``), Nomad's defaults and
validation (``canonical``, ``validate``, ``rules``), a scheduler that places allocations
by devices, cores and memory and explains failures with Nomad's own metric keys
(``scheduler``, ``devices``, ``attributes``, ``reconcile``), a raft-like index with
blocking queries (``state``, ``cluster``), deployments with progress deadlines on a
clock tests move (``deployments``), ACL policies, tokens and workload identities with
Nomad's capability rules (``acl``), Nomad Variables and the templates that read them
(``variables``), clients that tests drive (``commit``, ``lifecycle``) with their
``check_restart`` watcher (``checkwatch``), all behind ``FakeNomad`` (``fake``).
Behaviour is taken from docs/nomad-api.md and from Nomad's source, cited by section or
by file and function where it is subtle.

The dangerous direction is the obvious one: making the fake agree with llmgw. When the
two disagree, the reference decides.
"""

from __future__ import annotations

from llmgw.testing.fake_nomad.fake import FakeNomad
from llmgw.testing.fake_nomad.fixtures import (
    default_fleet,
    node_4x_l40s_48g,
    node_8x_h100_80g,
    node_cpu_64c,
    node_id,
)
from llmgw.testing.fake_nomad.records import Alloc, Deployment, Eval, Node, ServiceReg
from llmgw.testing.fake_nomad.server import Injection, RecordedRequest

__all__ = ["Alloc", "Deployment", "Eval", "FakeNomad", "Injection", "Node", "RecordedRequest",
           "ServiceReg", "default_fleet", "node_4x_l40s_48g", "node_8x_h100_80g",
           "node_cpu_64c", "node_id"]
