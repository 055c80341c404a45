"""What each model serves: declared in the entry or defaulted from its engine, checked at build."""

from __future__ import annotations

import json

import pytest

from llmgw.catalog import Model, Runtime, build_catalog
from llmgw.catalog.decode import decode_json, decode_model_file
from llmgw.errors import DefinitionError
from tests.catalog.test_catalog import H100, cpu_model, gpu_model


def test_each_kind_of_model_gets_its_engines_default_capabilities() -> None:
    """vLLM: chat, completions, responses; llama.cpp: chat, completions; upstream: + embeddings."""
    catalog = build_catalog([gpu_model("big"), cpu_model("small"),
                             Model(name="hosted", upstream=["https://api.example.com/v1"])], H100)
    assert catalog.models["big"].capabilities == ["chat", "completions", "responses"]
    assert catalog.models["small"].capabilities == ["chat", "completions"]
    assert catalog.models["hosted"].capabilities == ["chat", "completions", "embeddings"]


@pytest.mark.parametrize(("engine", "capabilities", "scraped"), [
    ("vllm", ["chat", "completions", "responses"], True),
    ("llama.cpp", ["chat", "completions"], True),
    ("sglang", ["chat", "completions"], True),
    ("openai", ["chat", "completions", "embeddings"], False),
    (None, ["chat", "completions", "embeddings"], False),
])
def test_an_external_model_gets_the_defaults_of_the_engine_it_names(
        engine: str | None, capabilities: list[str], scraped: bool) -> None:
    """An upstream that says its engine serves and is scraped as a scheduled replica of it;
    one that names none speaks OpenAI's API and is not scraped."""
    entry: dict[str, object] = {"name": "fleet", "upstream": ["http://10.0.0.9:8000"]}
    if engine is not None:
        entry["engine"] = engine
    built = build_catalog([decode_json(json.dumps(entry), Model)]).models["fleet"]
    assert built.capabilities == capabilities
    assert built.dialect == (engine or "openai")
    assert built.scrapes_engine is scraped
    quiet = decode_json(json.dumps({**entry, "routing": {"engine_metrics": False}}), Model)
    assert not quiet.scrapes_engine


def test_an_external_llama_cpp_is_not_held_to_the_embedded_servers_endpoints() -> None:
    """Under the local scheduler an external llama.cpp (which may be the C++ llama-server)
    may claim rerank, which only the embedded server lacks; speech no llama.cpp serves."""
    entry = {"name": "ext", "upstream": ["http://10.0.0.9:8080"], "engine": "llama.cpp"}
    ok = decode_json(json.dumps({**entry, "capabilities": ["chat", "rerank"]}), Model)
    assert build_catalog([ok], runtime=Runtime(scheduler="local")).models["ext"].capabilities \
        == ["chat", "rerank"]
    bad = decode_json(json.dumps({**entry, "capabilities": ["speech"]}), Model)
    with pytest.raises(DefinitionError, match="cannot be served by a llama.cpp replica"):
        build_catalog([bad], runtime=Runtime(scheduler="local"))


def test_declared_capabilities_replace_the_defaults() -> None:
    """A reranking vLLM model that declares [rerank, score] serves exactly those."""
    catalog = build_catalog([gpu_model("reranker", capabilities=["rerank", "score"])], H100)
    assert catalog.models["reranker"].capabilities == ["rerank", "score"]


def test_yaml_and_json_read_capabilities_with_the_same_decoder() -> None:
    """The YAML entry and the API's JSON body give the same model, and an unknown word is
    refused with its key path."""
    yaml_entry = ("name: asr\nupstream: [http://10.0.0.9:8000]\n"
                  "capabilities: [audio, speech]\n")
    json_entry = b'{"name": "asr", "upstream": ["http://10.0.0.9:8000"],' \
                 b' "capabilities": ["audio", "speech"]}'
    assert decode_model_file(yaml_entry, source="asr.yaml") == decode_json(json_entry, Model)
    with pytest.raises(DefinitionError) as err:
        decode_model_file("name: asr\nupstream: [http://x:1]\ncapabilities: [chat, dance]\n",
                          source="asr.yaml")
    assert err.value.field == "capabilities[1]"
    assert "asr.yaml: capabilities[1]" in err.value.message


@pytest.mark.parametrize(("capabilities", "field", "words"), [
    ([], "capabilities", "nothing to serve"),
    (["chat", "chat"], "capabilities[1]", "listed twice"),
])
def test_an_empty_or_repeated_list_is_refused(capabilities: list[str], field: str,
                                              words: str) -> None:
    """An empty list and a repeated word are definition errors naming the key."""
    with pytest.raises(DefinitionError) as err:
        build_catalog([gpu_model("big", capabilities=capabilities)], H100)
    assert err.value.field == field
    assert words in err.value.message


def test_the_embedded_llama_cpp_server_cannot_claim_rerank() -> None:
    """llama-cpp-python has no rerank endpoint: claiming it under the local scheduler is refused
    with what that server does answer, while the C++ llama-server on Nomad may claim it."""
    with pytest.raises(DefinitionError) as err:
        build_catalog([cpu_model("small", capabilities=["chat", "rerank"])],
                      runtime=Runtime(scheduler="local"))
    assert err.value.field == "capabilities[1]"
    assert "chat, completions and embeddings" in err.value.message
    on_nomad = with_fields(cpu_model("small"), capabilities=["chat", "rerank"],
                           source="https://mirror.example/gemma/1/x.gguf")
    nomad = build_catalog([on_nomad], runtime=Runtime(scheduler="nomad",
                                                      mirror="https://mirror.example"))
    assert nomad.models["small"].capabilities == ["chat", "rerank"]


def test_no_llama_cpp_server_serves_speech() -> None:
    """Text-to-speech is refused on llama.cpp whatever the scheduler."""
    on_nomad = with_fields(cpu_model("small"), capabilities=["speech"],
                           source="https://mirror.example/gemma/1/x.gguf")
    with pytest.raises(DefinitionError, match="'speech' cannot be served"):
        build_catalog([on_nomad], runtime=Runtime(scheduler="nomad",
                                                  mirror="https://mirror.example"))


def with_fields(model: Model, **changes: object) -> Model:
    """``model`` with fields given as they would be written in a file."""
    from llmgw.catalog.decode import convert, to_builtins

    return convert({**to_builtins(model), **changes}, Model)
