"""Profile fingerprints (C13): a stable hash of everything that changes how a
replica is launched.

A replica records the fingerprint it was started with; when the catalog's
differs, the replica runs a stale profile. The hash covers the source, the
engine, every profile field, the engine arguments and the environment, and
nothing else: changing a model's description, scaling or fallbacks must not
mark its replicas stale. Keys are sorted so the same definition always hashes
the same, whatever order a person wrote it in.
"""

from __future__ import annotations

import hashlib

import msgspec

from llmgw.catalog.model import Model, Profile

_encoder = msgspec.json.Encoder(order="sorted")


def fingerprint(model: Model, profile: Profile) -> str:
    """``sha256:`` and the first 16 hex digits of the hash of the launch inputs."""
    launch = {
        "source": model.source,
        "engine": model.engine,
        "served_name": model.engine_model_name,
        "profile": msgspec.to_builtins(profile, order="sorted"),
    }
    digest = hashlib.sha256(_encoder.encode(launch)).hexdigest()
    return f"sha256:{digest[:16]}"


def is_stale(replica_fingerprint: str, current: str) -> bool:
    """A replica is stale only when it recorded a fingerprint and it differs.

    An empty fingerprint means the replica was started outside llmgw or by an
    older version: unknown, not wrong.
    """
    return bool(replica_fingerprint) and replica_fingerprint != current
