"""Which endpoint a model can serve: the catalog's ``capabilities``, checked before routing.

A request to a model that cannot serve its endpoint is answered 400 naming
what the model does serve, before any replica is asked: a chat model sent a
rerank request would otherwise answer vLLM's bare 404 or, on llama.cpp's
embedded server, a 500 that ejects a healthy replica. A fallback that
cannot serve the endpoint is skipped rather than tried.

``/v1/responses`` is the one endpoint the gateway can serve for a model
whose replicas do not: a model with ``chat`` and without ``responses`` is
sent chat completions and its answers translated (``responses``).

Pure: no I/O, tested without a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from llmgw.catalog.engines import Capability
from llmgw.catalog.model import Model
from llmgw.gateway.errors import InvalidRequestError

ENDPOINT_CAPABILITY: dict[str, Capability] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/rerank": "rerank",
    "/v1/score": "score",
    "/v1/audio/transcriptions": "audio",
    "/v1/audio/translations": "audio",
    "/v1/audio/speech": "speech",
}

ResponsesMode = Literal["passthrough", "translate"]


class UnsupportedEndpointError(InvalidRequestError):
    """The model exists and the key may use it, but it does not serve this endpoint."""

    code = "unsupported_endpoint"


def responses_mode(model: Model) -> ResponsesMode | None:
    """How ``/v1/responses`` reaches ``model``: as it is, translated to chat, or not at all."""
    caps = model.capabilities or ()
    if "responses" in caps:
        return "passthrough"
    if "chat" in caps:
        return "translate"
    return None


def serves(model: Model, path: str) -> bool:
    capability = ENDPOINT_CAPABILITY.get(path)
    if capability is None:
        return True
    if capability == "responses":
        return responses_mode(model) is not None
    return capability in (model.capabilities or ())


def describe(model: Model) -> str:
    """What ``model`` serves, as a person would say it."""
    caps: list[str] = list(model.capabilities or ())
    if "responses" not in caps and "chat" in caps:
        caps.append("responses (translated to chat)")
    if len(caps) < 2:
        return "".join(caps) or "nothing"
    return ", ".join(caps[:-1]) + " and " + caps[-1]


def capable_chain(chain: Sequence[Model], path: str) -> list[Model]:
    """``chain`` without the fallbacks that cannot serve ``path``; 400 if the model cannot."""
    model = chain[0]
    if not serves(model, path):
        raise UnsupportedEndpointError(
            f"model {model.name!r} does not serve {path} ({ENDPOINT_CAPABILITY[path]}); it "
            f"serves {describe(model)} (capabilities in its catalog entry)", field="model")
    return [model, *(m for m in chain[1:] if serves(m, path))]
