"""The catalog's rules, as a pure function over decoded structs."""

from __future__ import annotations

import textwrap

import msgspec
import pytest
import yaml

from llmgw.catalog import Model, Profile, Scaling, build_catalog, fingerprint
from llmgw.catalog.decode import convert, decode_model_file, decode_yaml, to_builtins
from llmgw.catalog.model import GpuClass
from llmgw.catalog.source import Source
from llmgw.catalog.units import Duration, Size
from llmgw.config import ServerConfig, load_config
from llmgw.errors import ConfigError, DefinitionError

H100 = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB"))}


def cpu_model(name: str = "embed", **kw: object) -> Model:
    profile = Profile(name="cpu", gpus=0, cpu_cores=4, memory=Size.parse("8GiB"))
    return Model(name=name, source=Source.parse("/models/x.gguf"), engine="llama.cpp",
                 profiles=[profile], **kw)  # type: ignore[arg-type]


def gpu_model(name: str = "big", **kw: object) -> Model:
    profile = Profile(name="tp2", gpu_class="h100-80g", gpus=2, cpu_cores=8,
                      memory=Size.parse("64GiB"))
    return Model(name=name, source=Source.parse("hf://org/repo"), engine="vllm",
                 profiles=[profile], **kw)  # type: ignore[arg-type]


def test_a_model_entry_reads_the_same_from_server_yaml_and_from_an_add_file() -> None:
    """One decoder: the entry copied between models: and a ctl add file is the same model."""
    entry = textwrap.dedent("""\
        name: embed
        source: /models/x.gguf
        engine: llama.cpp
        profiles:
          - {name: cpu, gpus: 0, cpu_cores: 4, memory: 8GiB}
        scaling: {min: 0}
    """)
    indented = "models:\n" + "".join(
        ("  - " if i == 0 else "    ") + line + "\n" for i, line in enumerate(entry.splitlines()))
    server = decode_yaml(indented, ServerConfig, source="server.yaml")
    added = decode_model_file(entry, source="embed.yaml")
    assert server.models[0] == added


def test_an_unknown_field_is_refused_with_the_file_and_key_path() -> None:
    """A misspelt key names the file and where it is, rather than silently defaulting."""
    doc = "models:\n  - name: a\n    source: x\n    engine: vllm\n    profiles:\n" \
          "      - name: p\n        gpu: 2\n"
    with pytest.raises(ConfigError) as err:
        decode_yaml(doc, ServerConfig, source="server.yaml")
    assert err.value.field == "models[0].profiles[0].gpu"
    assert "server.yaml: models[0].profiles[0].gpu: unknown field" in err.value.message


def test_a_wrong_type_is_refused_with_the_key_path() -> None:
    """Gpus: two names models[0].profiles[0].gpus and the expected type."""
    doc = "models:\n  - name: a\n    profiles: [{name: p, gpus: two}]\n"
    with pytest.raises(ConfigError, match=r"models\[0\]\.profiles\[0\]\.gpus: Expected `int`"):
        decode_yaml(doc, ServerConfig, source="server.yaml")


def test_malformed_yaml_names_the_line() -> None:
    """Broken YAML says so with the line and column."""
    with pytest.raises(DefinitionError, match=r"m\.yaml: not valid YAML \(line 3"):
        decode_model_file("name: a\nprofiles: [\n", source="m.yaml")


@pytest.mark.parametrize(("name", "why"), [
    ("Qwen", "must start with a lowercase letter"),
    ("llama-3.1-8b", "contains '.'"),
    ("a" * 58, "is 58 characters long"),
    ("qwen_7b", "contains '_'"),
    ("trailing-", "must not end with '-'"),
    ("7b", "must start with a lowercase letter"),
])
def test_names_that_cannot_be_nomad_service_names_are_refused(name: str, why: str) -> None:
    """A name must make llmgw-<name> a valid Nomad job and service name."""
    with pytest.raises(DefinitionError, match=why) as err:
        build_catalog([cpu_model(name)])
    assert err.value.field == "name"


def test_a_57_character_name_is_the_longest_accepted() -> None:
    """Llmgw- plus 57 characters is Nomad's 63-character limit exactly."""
    assert len(build_catalog([cpu_model("a" * 57)])) == 1


def test_duplicate_names_are_refused() -> None:
    """Two models of one name would make routing ambiguous."""
    with pytest.raises(DefinitionError, match="defined twice"):
        build_catalog([cpu_model("a"), cpu_model("a")])


def test_a_fallback_to_an_unknown_model_is_refused() -> None:
    """A fallback pointing at nothing is found at build time, not during an outage."""
    with pytest.raises(DefinitionError, match="no model 'ghost'") as err:
        build_catalog([cpu_model("a", fallbacks=["ghost"])])
    assert err.value.field == "fallbacks[0]"


def test_a_model_cannot_fall_back_to_itself() -> None:
    """Falling back to yourself retries the failure."""
    with pytest.raises(DefinitionError, match="cannot fall back to itself"):
        build_catalog([cpu_model("a", fallbacks=["a"])])


def test_max_below_min_is_refused() -> None:
    """scaling.max < scaling.min names the field."""
    with pytest.raises(DefinitionError, match="below scaling.min") as err:
        build_catalog([cpu_model("a", scaling=Scaling(min=3, max=2))])
    assert err.value.field == "scaling.max"


def test_negative_counts_are_refused() -> None:
    """A negative replica or GPU count is an error, not zero."""
    with pytest.raises(DefinitionError, match="scaling.min: -1 is negative"):
        build_catalog([cpu_model("a", scaling=Scaling(min=-1))])
    bad = msgspec.structs.replace(gpu_model(), profiles=[Profile(name="p", gpus=-2)])
    with pytest.raises(DefinitionError, match="gpus: -2 is negative"):
        build_catalog([bad], H100)


def test_max_defaults_to_min_and_to_one_for_an_on_demand_model() -> None:
    """The catalog holds scaling as it will run, not as it was written."""
    cat = build_catalog([cpu_model("a", scaling=Scaling(min=3)),
                         cpu_model("b", scaling=Scaling(min=0))])
    assert cat.models["a"].scaling.max == 3
    assert cat.models["b"].scaling.max == 1


def test_a_cpu_model_without_memory_is_refused() -> None:
    """A CPU profile must declare memory and cores, which placement reserves."""
    bad = msgspec.structs.replace(
        cpu_model(), profiles=[Profile(name="cpu", gpus=0, cpu_cores=4)])
    with pytest.raises(DefinitionError, match="must declare memory") as err:
        build_catalog([bad])
    assert err.value.field == "profiles[0].memory"


def test_a_gpu_profile_needs_a_known_gpu_class() -> None:
    """An unknown gpu class lists the known ones."""
    with pytest.raises(DefinitionError, match="unknown gpu class 'h100-80g' .known: none"):
        build_catalog([gpu_model()], {})
    assert len(build_catalog([gpu_model()], H100)) == 1


def test_an_external_model_needs_no_source_and_cannot_have_profiles() -> None:
    """Upstream models are routed to, never scheduled: an engine names their dialect, but a
    source or profiles (how to run one) are refused."""
    ext = Model(name="ext", upstream=["http://10.0.0.1:8000"])
    assert build_catalog([ext]).models["ext"].external
    assert build_catalog([msgspec.structs.replace(ext, engine="vllm")]).models["ext"].external
    with pytest.raises(DefinitionError, match="external model") as err:
        build_catalog([msgspec.structs.replace(ext, engine="vllm",
                                               profiles=[Profile(name="p", gpus=1)])])
    assert err.value.field == "profiles"
    with pytest.raises(DefinitionError, match="external model") as err:
        build_catalog([convert({"name": "ext", "upstream": ["http://10.0.0.1:8000"],
                                "engine": "vllm", "source": "hf://org/repo"}, Model)])
    assert err.value.field == "source"
    with pytest.raises(DefinitionError, match="not an http"):
        build_catalog([Model(name="ext", upstream=["ftp://x"])])


@pytest.mark.parametrize("engine", ["sglang", "openai"])
def test_a_scheduled_model_cannot_run_a_dialect_llmgw_does_not_start(engine: str) -> None:
    """sglang and openai name what an external server speaks; llmgw runs vllm or llama.cpp."""
    with pytest.raises(DefinitionError, match="dialect of an external model") as err:
        build_catalog([msgspec.structs.replace(cpu_model("a"), engine=engine)])
    assert err.value.field == "engine"


def test_a_scheduled_model_needs_source_engine_and_profiles() -> None:
    """Each missing piece is named."""
    with pytest.raises(DefinitionError, match="needs a source"):
        build_catalog([Model(name="a")])


@pytest.mark.parametrize(("text", "expected"), [
    ("24GiB", 24 * 1024**3), ("80GB", 80 * 1000**3), ("512MiB", 512 * 1024**2),
    ("1.5GiB", int(1.5 * 1024**3)), (4096, 4096), ("81559MiB", 81559 * 1024**2),
])
def test_sizes_are_parsed_in_binary_and_decimal_units(text: str | int, expected: int) -> None:
    """Vendors sell in GB and report in MiB; both are understood."""
    assert Size.parse(text) == expected


def test_a_size_without_a_known_unit_is_refused_with_its_key_path() -> None:
    """24 gigs is not a size, and the decoder says which key holds it."""
    with pytest.raises(ValueError, match="not a size"):
        Size.parse("24 gigs")
    entry = "- name: m\n  source: /m.gguf\n  engine: llama.cpp\n" \
            "  profiles: [{name: cpu, cpu_cores: 2, memory: lots}]\n"
    with pytest.raises(DefinitionError, match=r"models\.yaml: \[0\]\.profiles\[0\]\.memory: "
                                              r"'lots' is not a size"):
        decode_yaml(entry, list[Model], source="models.yaml")


def test_durations_are_parsed() -> None:
    """15m, 1h30m, 250ms and bare seconds."""
    assert Duration.parse("15m") == 900
    assert Duration.parse("1h30m") == 5400
    assert Duration.parse("250ms") == 0.25
    assert Duration.parse(7) == 7
    with pytest.raises(ValueError, match="not a duration"):
        Duration.parse("soon")


def test_sizes_and_durations_read_back_as_written() -> None:
    """A stored model encodes each size and duration exactly as its author wrote it."""
    entry = ("name: m\nsource: hf://org/repo@refs%2Fpr%2F3\nengine: vllm\n"
             "profiles: [{name: p, gpu_class: h100-80g, gpus: 1, memory: 64 GiB}]\n"
             "scaling: {min: 0, idle_timeout: 1h30m, wait: 90}\n")
    m = decode_yaml(entry, Model, source="m.yaml")
    assert m.profiles[0].memory == 64 * 1024**3
    assert m.scaling.idle_timeout == 5400
    assert m.scaling.wait == 90
    assert to_builtins(m) == yaml.safe_load(entry)


def test_a_fingerprint_changes_with_what_launches_a_replica_and_nothing_else() -> None:
    """Engine args change it; description, scaling and fallbacks do not."""
    m = gpu_model()
    p = m.profiles[0]
    base = fingerprint(m, p)
    assert base == fingerprint(gpu_model(), p)
    assert base.startswith("sha256:")
    assert fingerprint(msgspec.structs.replace(m, description="x", scaling=Scaling(min=5)), p) \
        == base
    assert fingerprint(m, msgspec.structs.replace(p, engine_args=["--x"])) != base
    assert fingerprint(m, msgspec.structs.replace(p, env={"A": "1"})) != base
    assert fingerprint(msgspec.structs.replace(m, source=Source.parse("hf://org/other")), p) != base


def test_the_example_catalog_loads() -> None:
    """examples/server.yaml is a valid, realistic catalog."""
    cfg = load_config("examples/server.yaml", env={})
    cat = build_catalog(cfg.models, cfg.gpu_classes)
    assert {m.name for m in cat if m.external} == {"hosted-fallback"}
    assert any(m.scaling.min == 0 for m in cat)
    assert any(p.gpus == 0 for m in cat for p in m.profiles)


def test_a_broken_declared_model_stops_the_server_before_it_starts(tmp_path: object) -> None:
    """server.yaml with a bad model is a ConfigError naming models[i]."""
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "server.yaml"
    path.write_text("models:\n  - name: ok\n    upstream: [http://a:1]\n"
                    "  - name: bad\n    upstream: [http://a:1]\n    fallbacks: [nope]\n")
    with pytest.raises(ConfigError, match=r"server.yaml: models\[1\]: model 'bad'"):
        load_config(path, env={})


def test_environment_overrides_connection_settings(tmp_path: object) -> None:
    """LLMGW_DATABASE_URL and NOMAD_ADDR win over the file."""
    cfg = load_config("examples/server.yaml", env={
        "LLMGW_DATABASE_URL": "sqlite:///x.db", "NOMAD_ADDR": "https://n:4646",
        "LLMGW_ADMIN_TOKENS": "alice=s3cret-alice,plain-token-1"})
    assert cfg.database == "sqlite:///x.db"
    assert cfg.scheduler.nomad.address == "https://n:4646"
    assert cfg.admin_token_names() == {"s3cret-alice": "alice", "plain-token-1": "admin-1"}


def test_a_base64_admin_token_is_not_split_at_its_padding() -> None:
    """Q1w2...== is one token; splitting at '=' would make the secret a logged name."""
    cfg = load_config("examples/server.yaml", env={
        "LLMGW_ADMIN_TOKENS": "q1w2e3r4t5y6u7i8o9p0AsDfGhJkL==,Q9w8e7r6t5y4u3i2o1p0zX="})
    assert set(cfg.admin_token_names()) == {"q1w2e3r4t5y6u7i8o9p0AsDfGhJkL==",
                                            "Q9w8e7r6t5y4u3i2o1p0zX="}


def test_a_short_admin_token_is_refused() -> None:
    """An admin token opens every change; one of a few characters is guessable."""
    with pytest.raises(ConfigError, match="at least 8"):
        load_config("examples/server.yaml", env={"LLMGW_ADMIN_TOKENS": "ops=abc"})


def test_fallbacks_that_form_a_cycle_are_refused_naming_it() -> None:
    """a → b → c → a: the catalog refuses it, so no request can go round a loop."""
    with pytest.raises(DefinitionError, match=r"model 'c': fallbacks\[0\]: falling back to "
                                              r"'a' closes a cycle \(a → b → c → a\)") as err:
        build_catalog([cpu_model("a", fallbacks=["b"]), cpu_model("b", fallbacks=["c"]),
                       cpu_model("c", fallbacks=["a"])])
    assert err.value.field == "fallbacks[0]"
    build_catalog([cpu_model("a", fallbacks=["b", "c"]), cpu_model("b", fallbacks=["c"]),
                   cpu_model("c")])


def test_the_fallback_chain_is_depth_first_and_lists_each_model_once() -> None:
    catalog = build_catalog([cpu_model("a", fallbacks=["b", "d"]),
                             cpu_model("b", fallbacks=["c", "d"]), cpu_model("c"),
                             cpu_model("d", fallbacks=["e"]), cpu_model("e")])
    chain = catalog.fallback_chain(catalog.models["a"])
    assert [m.name for m in chain] == ["a", "b", "c", "d", "e"]
