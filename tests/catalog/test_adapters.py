"""Adapters in the catalog: their own kind of entry, checked against the base they run on."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.catalog.adapter import Adapter, lora_sizes
from llmgw.catalog.build import Runtime, build_catalog
from llmgw.catalog.decode import decode_yaml
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import GpuClass, Lora, Model, Profile
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import ServerConfig, check_config
from llmgw.errors import ConfigError, DefinitionError

DEFAULT_LORA = Lora()
GPUS = {"l40s": GpuClass(device="NVIDIA L40S", memory=Size.parse("46068MiB"))}


def base(name: str = "qwen", *, lora: Lora | None = DEFAULT_LORA, engine: str = "vllm",
         profile_lora: Lora | None = None) -> Model:
    return Model(name=name, source=Source.parse("http://mirror.internal/qwen/"),
                 engine=engine,  # type: ignore[arg-type]
                 profiles=[Profile(name="l40s", gpu_class="l40s", gpus=1, lora=profile_lora)],
                 lora=lora)


def adapter(name: str = "qwen-sql", **kw: object) -> Adapter:
    fields: dict[str, object] = {"base": "qwen",
                                 "source": Source.parse("/adapters/sql")}
    fields.update(kw)
    return Adapter(name=name, **fields)  # type: ignore[arg-type]


def refused(adapters: list[Adapter], models: list[Model] | None = None, *,
            runtime: Runtime | None = None) -> DefinitionError:
    with pytest.raises(DefinitionError) as err:
        build_catalog(models if models is not None else [base()], GPUS, runtime,
                      adapters=adapters)
    return err.value


def test_an_adapter_is_found_by_name_with_its_base() -> None:
    """A request's model may name an adapter; the catalog answers with it and its base."""
    catalog = build_catalog([base()], GPUS, adapters=[adapter(), adapter("qwen-chat")])
    found = catalog.served("qwen-sql")
    assert found is not None
    assert found[0].name == "qwen"
    assert found[1] == adapter()
    assert [a.name for a in catalog.adapters_of("qwen")] == ["qwen-chat", "qwen-sql"]
    assert catalog.served("qwen") == (catalog.models["qwen"], None)


def test_an_adapter_whose_base_does_not_exist_is_refused_naming_base() -> None:
    """The base must be a model of the catalog."""
    err = refused([adapter(base="llama")])
    assert err.field == "base"
    assert "there is no model 'llama'" in err.message


def test_an_adapter_named_like_a_model_is_refused() -> None:
    """Clients put either name in `model`, so the two share one name space."""
    err = refused([adapter("qwen")])
    assert err.field == "name"
    assert "is a model's name" in err.message


def test_a_base_without_a_lora_block_cannot_serve_adapters() -> None:
    """Enabling LoRA costs every replica memory, so it is asked for, never implied."""
    err = refused([adapter()], [base(lora=None)])
    assert err.field == "base"
    assert "serves no adapters: add a `lora:` block" in err.message


def test_an_external_base_and_llama_cpp_bases_are_refused() -> None:
    """Neither can load an adapter llmgw gives it."""
    external = Model(name="qwen", upstream=["http://10.0.0.1:8000"])
    assert "is external" in refused([adapter()], [external]).message
    cpp = Model(name="qwen", source=Source.parse("/models/q.gguf"), engine="llama.cpp",
                profiles=[Profile(name="cpu", cpu_cores=2, memory=Size.parse("4GiB"))],
                lora=Lora())
    err = refused([adapter(source=Source.parse("/adapters/sql.gguf"))], [cpp])
    assert err.field == "base"
    assert "llama-cpp-python" in err.message
    on_nomad = msgspec.structs.replace(cpp, source=Source.parse("http://m/q.gguf"))
    err = refused([adapter()], [on_nomad], runtime=Runtime(scheduler="nomad"))
    assert "llama-server loads adapters only at start (--lora)" in err.message


def test_a_rank_above_the_profiles_maximum_is_refused_naming_rank() -> None:
    """vLLM refuses to load an adapter of a rank above --max-lora-rank; llmgw says so first."""
    err = refused([adapter(rank=32)])
    assert err.field == "rank"
    assert "exceeds the maximum rank" in err.message
    assert "'l40s' (16" in err.message
    build_catalog([base(profile_lora=Lora(max_rank=64))], GPUS, adapters=[adapter(rank=32)])


def test_an_adapter_must_be_where_the_engines_read_it() -> None:
    """A local path is on no Nomad node, a Hub adapter reaches one only through the mirror,
    and the embedded engines read only this machine's disk."""
    local = refused([adapter(source=Source.parse("http://mirror.internal/sql/"))])
    assert local.field == "source"
    assert "give the directory's path" in local.message
    nomad = Runtime(scheduler="nomad")
    assert refused([adapter(source=Source.parse("/adapters/sql"))],
                   runtime=nomad).field == "source"
    assert "mirror" in refused([adapter(source=Source.parse("hf://org/sql-lora"))],
                               runtime=nomad).message
    file = refused([adapter(source=Source.parse("http://mirror.internal/sql.safetensors"))],
                   runtime=nomad)
    assert file.field == "source"
    assert "end the URL with '/'" in file.message


def test_lora_sizes_fill_in_defaults_and_a_profile_block_wins() -> None:
    """Four slots of rank 16 and four times as many in host memory, unless written."""
    m = base(lora=Lora(slots=2))
    assert lora_sizes(m, m.profiles[0]) is not None
    sizes = lora_sizes(m, m.profiles[0])
    assert sizes is not None
    assert (sizes.slots, sizes.max_rank, sizes.cpu_slots) == (2, 16, 8)
    p = base(profile_lora=Lora(slots=8, max_rank=32, cpu_slots=8))
    sizes = lora_sizes(p, p.profiles[0])
    assert sizes is not None
    assert (sizes.slots, sizes.max_rank, sizes.cpu_slots) == (8, 32, 8)
    assert lora_sizes(base(lora=None), None) is None


def test_an_invalid_lora_block_is_refused_with_its_path() -> None:
    """A rank vLLM does not accept, or a CPU cache smaller than the slots, fails at load."""
    with pytest.raises(DefinitionError, match=r"lora.max_rank: 24 is not a rank vLLM"):
        build_catalog([base(lora=Lora(max_rank=24))], GPUS)
    with pytest.raises(DefinitionError, match=r"profiles\[0\].lora.cpu_slots"):
        build_catalog([base(profile_lora=Lora(slots=4, cpu_slots=2))], GPUS)


def test_adapters_do_not_change_the_bases_fingerprint_but_its_lora_block_does() -> None:
    """Adding an adapter never restarts a replica; changing the slots does."""
    with_lora, without = base(), base(lora=None)
    p = with_lora.profiles[0]
    assert fingerprint(with_lora, p) != fingerprint(without, p)
    before = build_catalog([with_lora], GPUS)
    after = build_catalog([with_lora], GPUS, adapters=[adapter()])
    assert before.fingerprint("qwen", "l40s") == after.fingerprint("qwen", "l40s")


def test_server_yaml_declares_adapters_and_names_the_bad_one() -> None:
    """An error in adapters: names its index in the file."""
    text = """
gpu_classes: {l40s: {device: NVIDIA L40S, memory: 46068MiB}}
models:
  - name: qwen
    source: /models/qwen
    engine: vllm
    lora: {slots: 4}
    profiles: [{name: l40s, gpu_class: l40s, gpus: 1}]
adapters:
  - {name: qwen-sql, base: qwen, source: /adapters/sql, rank: 8}
  - {name: qwen-law, base: nope, source: /adapters/law}
"""
    cfg = decode_yaml(text, ServerConfig, source="server.yaml")
    assert cfg.adapters[0].rank == 8
    with pytest.raises(ConfigError, match=r"server.yaml: adapters\[1\]: adapter 'qwen-law': "
                                          r"base: there is no model 'nope'"):
        check_config(cfg, "server.yaml")
