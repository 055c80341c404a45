"""Profile fingerprints: a stable hash of everything that changes how a
replica is launched.

A replica records the fingerprint it was started with; when the catalog's
differs, the replica runs a stale profile. The hash covers the source, the
engine, every profile field, the engine arguments and the environment, and
nothing else: changing a model's description, scaling or fallbacks must not
mark its replicas stale. Keys are sorted so the same definition always hashes
the same, whatever order a person wrote it in.

Sizes and sources are hashed as their author wrote them (their encoded form,
``llmgw.catalog.decode.to_builtins``), which is also what llmgw hashed before
they became typed values: a replica started by an older llmgw keeps matching
its profile after an upgrade (``tests/catalog/test_fingerprint.py`` holds
fingerprints computed by the earlier code).
"""

from __future__ import annotations

import hashlib

from llmgw.catalog.decode import encode
from llmgw.catalog.model import Model, Profile


def fingerprint(model: Model, profile: Profile) -> str:
    """``sha256:`` and the first 16 hex digits of the hash of the launch inputs."""
    launch: dict[str, object] = {
        "source": model.source,
        "engine": model.engine,
        "served_name": model.engine_model_name,
        "profile": profile,
    }
    if model.lora is not None and profile.lora is None:
        # The model's adapter capacity is a launch input (the engine's LoRA flags);
        # which adapters exist is not: they are loaded into running replicas.
        launch["lora"] = model.lora
    digest = hashlib.sha256(encode(launch, sort_keys=True)).hexdigest()
    return f"sha256:{digest[:16]}"


# Models are frozen: the same object always has the same fingerprints. Views of
# every model are built on each listing, and hashing 2,000 models' profiles
# again each time cost a third of a listing. The cached model is held, so its
# id cannot be reused while it is a key; the table is bounded by clearing it.
_CACHE_MAX = 8192
_cache: dict[int, tuple[Model, dict[str, str]]] = {}


def fingerprints(model: Model) -> dict[str, str]:
    """Every profile's fingerprint, by profile name (computed once per model object)."""
    hit = _cache.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    found = {p.name: fingerprint(model, p) for p in model.profiles}
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[id(model)] = (model, found)
    return found


def is_stale(replica_fingerprint: str, current: str) -> bool:
    """A replica is stale only when it recorded a fingerprint and it differs.

    An empty fingerprint means the replica was started outside llmgw or by an
    older version: unknown, not wrong.
    """
    return bool(replica_fingerprint) and replica_fingerprint != current
