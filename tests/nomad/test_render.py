"""A catalog entry renders as the Nomad job N1–N5 describe, in Nomad's own JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest

from llmgw.catalog.build import Runtime, build_catalog
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Duration, Size
from llmgw.config import NomadConfig, load_config
from llmgw.errors import ConfigError, DefinitionError
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad.render import (
    ENGINE_START,
    LOAD_RATE,
    deadlines,
    need_of,
    render_job,
    spec_hash,
    with_count,
)

from .shapes import GPU_CLASSES

CFG = NomadConfig(namespace="llm", region="global", datacenters=["dc1"])
MIRROR = "http://mirror.internal:8070"

LLAMA = Model(
    name="llama-3-3-70b-instruct", source=Source.parse("hf://meta-llama/Llama-3.3-70B-Instruct"),
    engine="vllm", served_name="meta-llama/Llama-3.3-70B-Instruct",
    profiles=[Profile(name="h100-tp2", gpu_class="h100-80g", gpus=2, fabric="ib-a",
                      context=32768, cpu_cores=16, memory=Size.parse("192GiB"), quantization="fp8",
                      engine_args=["--enable-prefix-caching"], env={"VLLM_LOGGING_LEVEL": "INFO"})],
    scaling=Scaling(min=2),
)
EMBED = Model(
    name="nomic-embed-text", engine="llama.cpp",
    source=Source.parse(f"{MIRROR}/nomic-embed-text-v1-5/q8_0/nomic-embed-text-v1.5.Q8_0.gguf"),
    profiles=[Profile(name="cpu-8", gpus=0, context=8192, cpu_cores=8, memory=Size.parse("4GiB"),
                      engine_args=["--embedding"])],
)


def _json(job: js.Job) -> dict[str, Any]:
    return json.loads(js.encode(js.JobRegisterRequest(Job=job)))["Job"]


def _task(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in job["TaskGroups"][0]["Tasks"] if t["Name"] == name)


def test_one_service_job_per_model_with_meta_naming_model_profile_and_fingerprint():
    """The job is llmgw-<model>, one group counting the replicas, meta saying what it is."""
    job = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 2, MIRROR))
    assert job["ID"] == job["Name"] == "llmgw-llama-3-3-70b-instruct"
    assert job["Type"] == "service"
    assert job["Namespace"] == "llm"
    assert job["Datacenters"] == ["dc1"]
    assert len(job["TaskGroups"]) == 1
    assert job["TaskGroups"][0]["Count"] == 2
    meta = job["Meta"]
    assert meta["llmgw_model"] == "llama-3-3-70b-instruct"
    assert meta["llmgw_profile"] == "h100-tp2"
    assert meta["llmgw_fingerprint"] == fingerprint(LLAMA, LLAMA.profiles[0])
    assert meta["llmgw_managed"] == "true"
    assert len(meta["llmgw_spec"]) == 16


def test_gpu_profile_requests_nvidia_gpus_constrained_by_model_memory_and_fabric():
    """Devices: nvidia/gpu × gpus, on the exact device string and the memory cards report."""
    job = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 2, MIRROR))
    resources = _task(job, "engine")["Resources"]
    assert resources["Devices"] == [{
        "Name": "nvidia/gpu", "Count": 2,
        "Constraints": [
            {"LTarget": "${device.model}", "Operand": "=", "RTarget": "NVIDIA H100 80GB HBM3"},
            {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "81559 MiB"},
        ],
    }]
    assert job["TaskGroups"][0]["Constraints"] == [
        {"LTarget": "${meta.llmgw_fabric}", "Operand": "=", "RTarget": "ib-a"}]


def test_cores_and_memory_are_reserved_and_cpu_never_beside_cores():
    """The engine reserves Cores and MemoryMB; CPU is absent so Nomad adds no default beside it."""
    for model in (LLAMA, EMBED):
        job = _json(render_job(model, model.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
        resources = _task(job, "engine")["Resources"]
        assert "CPU" not in resources
        for task in job["TaskGroups"][0]["Tasks"]:
            r = task["Resources"]
            assert not (r.get("CPU") and r.get("Cores")), task["Name"]
    llama = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    assert _task(llama, "engine")["Resources"]["Cores"] == 16
    assert _task(llama, "engine")["Resources"]["MemoryMB"] == 192 * 1024
    with pytest.raises(ValueError, match="not both"):
        js.Resources(Cores=2, CPU=100)


def test_vllm_runs_in_docker_with_port_context_tensor_parallel_and_quantization():
    """vLLM gets the served name, port, max-model-len, tensor-parallel size, quantization, args."""
    job = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    engine = _task(job, "engine")
    assert engine["Driver"] == "docker"
    cfg = engine["Config"]
    assert cfg["image"] == CFG.vllm_image
    assert cfg["ports"] == ["http"]
    args = cfg["args"]
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--served-model-name"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert pairs["--port"] == "8000"
    assert pairs["--max-model-len"] == "32768"
    assert pairs["--tensor-parallel-size"] == "2"
    assert pairs["--quantization"] == "fp8"
    assert args[-1] == "--enable-prefix-caching"
    assert engine["Env"] == {"VLLM_LOGGING_LEVEL": "INFO"}
    net = job["TaskGroups"][0]["Networks"]
    assert net == [{"Mode": "host", "DynamicPorts": [{"Label": "http", "To": 8000}]}]


def test_llama_cpp_server_threads_are_the_reserved_cores():
    """llama-server runs with --threads = cpu_cores, --ctx-size = context, on its port, and
    publishes /metrics."""
    job = _json(render_job(EMBED, EMBED.profiles[0], CFG, GPU_CLASSES, 2, MIRROR))
    engine = _task(job, "engine")
    assert engine["Config"]["image"] == CFG.llama_cpp_image
    args = engine["Config"]["args"]
    assert args[args.index("--threads") + 1] == "8"
    assert args[args.index("--ctx-size") + 1] == "8192"
    assert args[args.index("--port") + 1] == "8080"
    assert args[args.index("--alias") + 1] == "nomic-embed-text"
    assert "--metrics" in args   # or llama-server answers /metrics with 501
    assert "Devices" not in engine["Resources"]
    assert engine["Resources"] == {"Cores": 8, "MemoryMB": 4096}


def test_a_prestart_task_fetches_the_weights_into_the_host_volume_cache():
    """`llmgw fetch URL DEST` runs before the engine, into the cache volume the engine reads."""
    job = _json(render_job(EMBED, EMBED.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    group = job["TaskGroups"][0]
    fetch = _task(job, "fetch")
    assert fetch["Lifecycle"] == {"Hook": "prestart", "Sidecar": False}
    assert fetch["Config"]["command"] == "llmgw"
    url = str(EMBED.source)
    dest = ("/llmgw-cache/mirror.internal_8070/nomic-embed-text-v1-5/q8_0/"
            "nomic-embed-text-v1.5.Q8_0.gguf")
    assert fetch["Config"]["args"] == ["fetch", url, dest, "--progress-file",
                                      "${NOMAD_ALLOC_DIR}/llmgw-fetch.json"]
    assert group["Volumes"] == {"cache": {"Name": "cache", "Type": "host",
                                          "Source": "llmgw-model-cache", "ReadOnly": False}}
    engine = _task(job, "engine")
    assert engine["VolumeMounts"] == [{"Volume": "cache", "Destination": "/llmgw-cache",
                                       "ReadOnly": True}]
    assert engine["Config"]["args"][:2] == ["--model", dest]


def test_a_hub_source_is_fetched_from_the_mirror_layout():
    """hf://org/repo@rev is read from <mirror>/<org>--<repo>/<rev>/, the layout `mirror add`
    writes (tests/mirror/test_mirror_path.py holds the whole mapping)."""
    m = msgspec.structs.replace(LLAMA, source=Source.parse("hf://Qwen/Qwen2.5-14B-Instruct@cf98f3b"))
    job = _json(render_job(m, m.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    assert _task(job, "fetch")["Config"]["args"][1] == \
        f"{MIRROR}/qwen--qwen2.5-14b-instruct/cf98f3b/"


def test_without_a_mirror_vllm_downloads_from_the_hub_into_the_cache():
    """No mirror: no fetch task; vLLM gets the repo and revision and HF_HOME on the cache."""
    m = msgspec.structs.replace(LLAMA, source=Source.parse("hf://Qwen/Qwen2.5-14B-Instruct@cf98f3b"))
    job = _json(render_job(m, m.profiles[0], CFG, GPU_CLASSES, 1, None))
    assert [t["Name"] for t in job["TaskGroups"][0]["Tasks"]] == ["engine"]
    engine = _task(job, "engine")
    args = engine["Config"]["args"]
    assert args[:4] == ["--model", "Qwen/Qwen2.5-14B-Instruct", "--revision", "cf98f3b"]
    assert engine["Env"]["HF_HOME"] == "/llmgw-cache/hf"
    assert engine["VolumeMounts"][0]["ReadOnly"] is False


def test_sources_a_nomad_node_cannot_use_are_refused_with_the_way_out():
    """A local path, or a llama.cpp directory, is refused when the catalog is built."""
    nomad = Runtime(scheduler="nomad", mirror=MIRROR)
    local = msgspec.structs.replace(EMBED, source=Source.parse("/models/x.gguf"))
    with pytest.raises(DefinitionError, match="llmgw mirror add"):
        build_catalog([local], GPU_CLASSES, nomad)
    folder = msgspec.structs.replace(EMBED, source=Source.parse(f"{MIRROR}/nomic/q8_0/"))
    with pytest.raises(DefinitionError, match="name the file"):
        build_catalog([folder], GPU_CLASSES, nomad)
    one_file = msgspec.structs.replace(
        LLAMA, source=Source.parse("hf://Qwen/Qwen2.5-14B-Instruct-GGUF/q8_0.gguf"))
    with pytest.raises(DefinitionError, match="set mirror"):
        build_catalog([one_file], GPU_CLASSES, Runtime(scheduler="nomad"))
    assert build_catalog([local], GPU_CLASSES, Runtime(scheduler="local"))


def test_the_service_uses_the_nomad_provider_with_an_http_health_check_in_nanoseconds():
    """Provider nomad, name llmgw-<model>, tags, an HTTP check on /health in ns, ≥ 1 s."""
    job = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    (service,) = _task(job, "engine")["Services"]
    assert service["Provider"] == "nomad"
    assert service["Name"] == "llmgw-llama-3-3-70b-instruct"
    assert service["PortLabel"] == "http"
    fp = fingerprint(LLAMA, LLAMA.profiles[0])
    assert service["Tags"] == ["llmgw", "model=llama-3-3-70b-instruct", "profile=h100-tp2",
                               f"fingerprint={fp}", "gpu_class=h100-80g"]
    (check,) = service["Checks"]
    assert check["Type"] == "http"
    assert check["Path"] == "/health"
    assert check["Interval"] == 10_000_000_000
    assert check["Timeout"] == 5_000_000_000
    assert check["Interval"] >= 1_000_000_000
    assert check["Timeout"] >= 1_000_000_000


def test_deployment_policies_allow_loads_of_many_minutes():
    """Deadlines are hours, keeping MinHealthyTime < HealthyDeadline < ProgressDeadline."""
    job = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    group = job["TaskGroups"][0]
    u = group["Update"]
    assert u["MinHealthyTime"] < u["HealthyDeadline"] < u["ProgressDeadline"]
    assert u["HealthyDeadline"] >= 3600 * 10**9
    assert u["ProgressDeadline"] >= 2 * 3600 * 10**9
    assert u["HealthCheck"] == "checks"
    assert u["MaxParallel"] == 1
    assert group["Migrate"]["HealthyDeadline"] == u["HealthyDeadline"]
    assert group["RestartPolicy"]["Mode"] == "fail"
    assert group["ReschedulePolicy"]["Unlimited"] is True


def test_the_health_check_belongs_to_the_engine_so_its_grace_starts_with_the_engine():
    """No group service: the check registers at the engine's Poststart, after the fetch."""
    for model in (LLAMA, EMBED):
        job = _json(render_job(model, model.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
        group = job["TaskGroups"][0]
        assert "Services" not in group
        assert "Services" not in _task(job, "fetch")
        [service] = _task(job, "engine")["Services"]
        assert service["PortLabel"] == "http"
        grace = service["Checks"][0]["CheckRestart"]["Grace"]
        assert grace < group["Update"]["HealthyDeadline"]


def test_deadlines_grow_with_the_bytes_a_replica_moves():
    """A 4-GPU 70B waits longer than a CPU embedder; the floors hold for small models."""
    small = deadlines(need_of(EMBED, EMBED.profiles[0], CFG, GPU_CLASSES), CFG,
                      engine_downloads=False)
    assert (small.healthy, small.progress) == (3600, 7200)   # the configured least
    assert small.grace == math.ceil(4 * 1024 / 512 + ENGINE_START)
    big = msgspec.structs.replace(LLAMA.profiles[0], gpus=8, fabric=None)
    b = deadlines(need_of(LLAMA, big, CFG, GPU_CLASSES), CFG, engine_downloads=False)
    weights = 8 * 81559 * 1024**2
    assert b.healthy == math.ceil(CFG.image_pull_timeout + weights / CFG.download_rate
                                  + weights / LOAD_RATE + ENGINE_START)
    assert b.healthy > 2 * 3600
    assert b.progress == 2 * b.healthy
    assert b.grace == math.ceil(weights / LOAD_RATE + ENGINE_START)
    hub = deadlines(need_of(LLAMA, big, CFG, GPU_CLASSES), CFG, engine_downloads=True)
    assert hub.grace == math.ceil(weights / LOAD_RATE + ENGINE_START
                                  + weights / CFG.download_rate)


def test_the_engine_image_may_take_the_configured_time_to_pull():
    """image_pull_timeout, as a Go duration, on the engine task (the driver's default is 5m)."""
    for model in (LLAMA, EMBED):
        job = _json(render_job(model, model.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
        assert _task(job, "engine")["Config"]["image_pull_timeout"] == "1800s"


def test_a_gpu_profile_without_cores_or_memory_gets_the_per_gpu_defaults():
    """Leaving cores and memory out reserves cores_per_gpu and memory_per_gpu per GPU."""
    p = Profile(name="bare", gpu_class="h100-80g", gpus=2)
    m = msgspec.structs.replace(LLAMA, profiles=[p])
    r = _task(_json(render_job(m, p, CFG, GPU_CLASSES, 1, MIRROR)), "engine")["Resources"]
    assert r["Cores"] == 2 * CFG.cores_per_gpu
    assert r["MemoryMB"] == 2 * 32 * 1024


def test_the_spec_hash_ignores_the_count_and_follows_every_other_change():
    """Re-rendering with another count keeps the spec hash; any launch change moves it."""
    a = render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 2, MIRROR)
    b = render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 5, MIRROR)
    assert a.Meta["llmgw_spec"] == b.Meta["llmgw_spec"] == spec_hash(with_count(a, 9))
    edited = msgspec.structs.replace(LLAMA.profiles[0], context=16384)
    c = render_job(LLAMA, edited, CFG, GPU_CLASSES, 2, MIRROR)
    assert c.Meta["llmgw_spec"] != a.Meta["llmgw_spec"]
    image = msgspec.structs.replace(CFG, vllm_image="vllm/vllm-openai:v0.9.0")
    d = render_job(LLAMA, LLAMA.profiles[0], image, GPU_CLASSES, 2, MIRROR)
    assert d.Meta["llmgw_spec"] != a.Meta["llmgw_spec"]
    assert d.Meta["llmgw_fingerprint"] == a.Meta["llmgw_fingerprint"]


def test_rendering_settings_that_nomad_would_refuse_fail_at_startup(tmp_path):
    """Deadlines out of order or a bad size are a ConfigError naming the file and key."""
    path = tmp_path / "server.yaml"
    path.write_text("scheduler: {kind: nomad, nomad: {healthy_deadline: 3h}}\n")
    with pytest.raises(ConfigError, match=r"server\.yaml: scheduler\.nomad\.healthy_deadline"):
        load_config(path, env={})
    path.write_text("scheduler: {kind: nomad, nomad: {memory_per_gpu: lots}}\n")
    with pytest.raises(ConfigError, match=r"scheduler\.nomad\.memory_per_gpu: 'lots' is not"):
        load_config(path, env={})
    path.write_text("scheduler: {kind: nomad, nomad: {healthy_deadline: 90m}}\n")
    assert load_config(path, env={}).scheduler.nomad.healthy_deadline == 5400
    path.write_text("scheduler: {kind: nomad, nomad: {download_rate: 10KiB}}\n")
    with pytest.raises(ConfigError, match=r"scheduler\.nomad\.download_rate: 10KiB per second"):
        load_config(path, env={})
    path.write_text("scheduler: {kind: nomad, nomad: {image_pull_timeout: 0s}}\n")
    with pytest.raises(ConfigError, match=r"scheduler\.nomad\.image_pull_timeout"):
        load_config(path, env={})


def test_replicas_are_spread_across_nodes_or_kept_apart_when_the_profile_asks():
    """A spread on ${node.unique.id} by default; distinct_hosts: true makes it a constraint."""
    job = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 2, MIRROR))
    group = job["TaskGroups"][0]
    assert group["Spreads"] == [{"Attribute": "${node.unique.id}", "Weight": 100}]
    apart = msgspec.structs.replace(LLAMA.profiles[0], distinct_hosts=True)
    group = _json(render_job(LLAMA, apart, CFG, GPU_CLASSES, 2, MIRROR))["TaskGroups"][0]
    assert "Spreads" not in group
    assert {"Operand": "distinct_hosts", "RTarget": "true"} in group["Constraints"]
    one = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    two = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 2, MIRROR))
    assert one["Meta"]["llmgw_spec"] == two["Meta"]["llmgw_spec"]   # scaling is not a change


def test_a_cpu_profile_keeps_off_gpu_nodes_unless_it_asks_for_them():
    """CPU: ${meta.llmgw_gpu_class} is_not_set; gpu_nodes: true drops it; GPUs never get it."""
    cpu = _json(render_job(EMBED, EMBED.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    off_gpu = {"LTarget": "${meta.llmgw_gpu_class}", "Operand": "is_not_set"}
    assert off_gpu in cpu["TaskGroups"][0]["Constraints"]
    allowed = msgspec.structs.replace(EMBED.profiles[0], gpu_nodes=True)
    anywhere = _json(render_job(EMBED, allowed, CFG, GPU_CLASSES, 1, MIRROR))
    assert off_gpu not in anywhere["TaskGroups"][0].get("Constraints", [])
    gpu = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    assert off_gpu not in gpu["TaskGroups"][0]["Constraints"]


def test_gpu_nodes_is_refused_on_a_gpu_profile():
    """Only a CPU profile chooses whether to use GPU nodes; the error names the field."""
    p = msgspec.structs.replace(LLAMA.profiles[0], gpu_nodes=True)
    with pytest.raises(DefinitionError, match=r"profiles\[0\]\.gpu_nodes: only a CPU profile"):
        build_catalog([msgspec.structs.replace(LLAMA, profiles=[p])], GPU_CLASSES)


def test_a_cpu_replicas_service_has_no_gpu_class_tag():
    """Only a GPU profile names a gpu class; Prometheus leaves the label off a CPU one."""
    job = _json(render_job(EMBED, EMBED.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    (service,) = _task(job, "engine")["Services"]
    assert [t for t in service["Tags"] if t.startswith("gpu_class=")] == []
    assert service["Tags"][:3] == ["llmgw", "model=nomic-embed-text", "profile=cpu-8"]


def test_shutdown_delay_is_the_models_drain_timeout_in_nanoseconds():
    """Nomad deregisters a stopping task's service, then waits its shutdown_delay before
    signalling the engine: that wait is the model's timeouts.drain (at least 10 s, for the
    gateways to see the registration go), on the engine task that owns the service (a
    group's delay would run while the task's service is still registered); kill_timeout
    stays the engine's exit grace."""
    drained = msgspec.structs.replace(
        LLAMA, timeouts=msgspec.structs.replace(LLAMA.timeouts, drain=Duration.parse("2m")))
    job = _json(render_job(drained, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    assert _task(job, "engine")["ShutdownDelay"] == 120 * 10**9
    assert "ShutdownDelay" not in job["TaskGroups"][0]
    assert _task(job, "engine")["KillTimeout"] == 30 * 10**9
    default = _json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR))
    assert _task(default, "engine")["ShutdownDelay"] == 30 * 10**9
    short = msgspec.structs.replace(
        LLAMA, timeouts=msgspec.structs.replace(LLAMA.timeouts, drain=Duration.parse("1s")))
    assert _task(_json(render_job(short, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR)),
                 "engine")["ShutdownDelay"] == 10 * 10**9


def test_a_base_with_a_lora_block_starts_vllm_with_runtime_lora_loading():
    """--enable-lora and the slot sizes, and the switch that mounts the load endpoints."""
    from llmgw.catalog.model import Lora

    base = msgspec.structs.replace(LLAMA, lora=Lora(slots=8, max_rank=32))
    engine = _task(_json(render_job(base, base.profiles[0], CFG, GPU_CLASSES, 1, MIRROR)),
                   "engine")
    args = engine["Config"]["args"]
    assert "--enable-lora" in args
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    at = args.index("--max-loras")
    assert args[at:at + 6] == ["--max-loras", "8", "--max-lora-rank", "32",
                               "--max-cpu-loras", "32"]
    assert args[-1] == "--enable-prefix-caching"      # the profile's own arguments still last
    assert pairs["--served-model-name"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert engine["Env"] == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                             "VLLM_LOGGING_LEVEL": "INFO"}
    plain = _task(_json(render_job(LLAMA, LLAMA.profiles[0], CFG, GPU_CLASSES, 1, MIRROR)),
                  "engine")
    assert "--enable-lora" not in plain["Config"]["args"]
