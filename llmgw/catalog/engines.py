"""What each engine's OpenAI-compatible server speaks: one row of facts per dialect.

A model's ``engine`` says which server answers it. For a scheduled model it
is also what llmgw starts (``vllm`` or ``llama.cpp``); for an external one
(``upstream``) it starts nothing and only names the dialect, so a vLLM fleet
run outside llmgw gets what a vLLM replica llmgw runs gets. An external
model that names no engine speaks ``openai``: the API as OpenAI publishes it,
with no engine's extensions, so nothing is sent that a hosted service would
refuse or misread.

The gateway asks this table, never the engine's name, what it may do:

* ``capabilities``: what the model serves when its entry does not say
  (``llmgw.catalog.build``).
* ``continues_chat``: a broken chat stream is resumed by re-sending the
  delivered text as a final assistant message with
  ``continue_final_message: true`` (``llmgw.gateway.resume``);
  ``generation_prompt_flag``: and with ``add_generation_prompt: false``.
* ``tokenize``: ``POST /tokenize`` with ``{model, prompt,
  add_special_tokens}`` answers ``{count}``; a resumption counts the
  delivered text's tokens with it (``llmgw.gateway.proxy``).
* ``metrics``: ``/metrics`` in Prometheus' text with the queue gauges
  ``llmgw.gateway.signals`` reads, scraped unless ``routing.engine_metrics``
  says otherwise.
* ``schema_as_json_object``: a JSON-schema ``response_format`` is sent as
  ``{"type": "json_object", "schema": …}`` (``llmgw.gateway.dialects``).

The facts, from each server's own code:

* vLLM: ``continue_final_message`` and ``add_generation_prompt`` on
  ``ChatCompletionRequest``; ``/tokenize`` answering ``count``
  (vllm/entrypoints/serve/tokenize/protocol.py); ``vllm:num_requests_*``.
* llama.cpp: no ``continue_final_message`` in llama-cpp-python 0.3's
  ``CreateChatCompletionRequest`` (it renders the template with the
  generation prompt always added), and the C++ llama-server's ``/tokenize``
  takes ``content`` and answers ``tokens`` — neither is used; ``llamacpp:*``
  metrics with ``--metrics``; a JSON schema as ``json_object`` + ``schema``,
  which both servers accept (see ``llmgw.gateway.dialects``).
* SGLang: ``continue_final_message`` on ``ChatCompletionRequest``, which
  appends the final assistant message's text after the chat template's
  generation prompt (python/sglang/srt/entrypoints/openai/protocol.py,
  serving_chat.py ``_handle_last_assistant_message``); it has no
  ``add_generation_prompt`` field, so none is sent. ``/tokenize`` (also
  ``/v1/tokenize``, http_server.py) takes ``model``, ``prompt`` and
  ``add_special_tokens`` and answers ``tokens``, ``count`` and
  ``max_model_len`` (``TokenizeRequest``, serving_tokenize.py). With
  ``--enable-metrics``, ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``
  and ``sglang:token_usage`` (srt/metrics/collector.py). It serves
  ``/v1/responses`` too, but only chat and completions are assumed (as
  for vLLM, a pooling checkpoint serves neither): the gateway translates
  Responses to chat unless the entry lists ``responses``.
* OpenAI: chat, completions and embeddings; none of the above.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# The server a model's replicas run: started by llmgw (scheduled), or only spoken to.
Engine = Literal["vllm", "llama.cpp", "sglang", "openai"]
# The engines llmgw runs itself; the others are dialects of external models.
Scheduled = Literal["vllm", "llama.cpp"]
SCHEDULED: tuple[Scheduled, ...] = ("vllm", "llama.cpp")
# What an external model that names no engine speaks.
DEFAULT_EXTERNAL: Engine = "openai"

# What a model's replicas answer themselves, one word per family of
# endpoints: chat (/v1/chat/completions), completions, responses
# (/v1/responses), embeddings, rerank (/v1/rerank), score (/v1/score), audio
# (/v1/audio/transcriptions and /translations), speech (/v1/audio/speech).
Capability = Literal["chat", "completions", "responses", "embeddings", "rerank", "score",
                     "audio", "speech"]


class Dialect(msgspec.Struct, frozen=True, kw_only=True):
    capabilities: tuple[Capability, ...]
    continues_chat: bool = False
    generation_prompt_flag: bool = False
    tokenize: bool = False
    metrics: bool = False
    schema_as_json_object: bool = False


DIALECTS: dict[Engine, Dialect] = {
    # A vLLM replica runs one task — generation, pooling (embeddings, rerank, score) or
    # speech recognition — decided by the checkpoint, so only generation is assumed.
    "vllm": Dialect(capabilities=("chat", "completions", "responses"), continues_chat=True,
                    generation_prompt_flag=True, tokenize=True, metrics=True),
    # Both llama.cpp servers answer chat and completions; embeddings need a flag (and, in
    # llama-cpp-python, turn generation off), so they are declared.
    "llama.cpp": Dialect(capabilities=("chat", "completions"), metrics=True,
                         schema_as_json_object=True),
    "sglang": Dialect(capabilities=("chat", "completions"), continues_chat=True,
                      tokenize=True, metrics=True),
    # Any OpenAI-compatible server: the three classic endpoints.
    "openai": Dialect(capabilities=("chat", "completions", "embeddings")),
}


def dialect_of(engine: Engine | None, external: bool) -> Engine:
    """The dialect a model's replicas speak: its engine, or ``openai`` for an external
    model that names none (a scheduled model always names one once it is checked)."""
    return engine or (DEFAULT_EXTERNAL if external else "vllm")


def speaks(dialect: Engine | None) -> Dialect:
    """The facts of ``dialect``; None (no engine named) is ``openai``."""
    return DIALECTS[dialect or DEFAULT_EXTERNAL]
