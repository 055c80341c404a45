"""Job bodies shaped like the ones llmgw renders, written here from the reference.

They are deliberately built by hand from docs/nomad-api.md §1.8 rather than by llmgw's
renderer: these tests pin the fake, not the renderer.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx

S = 1_000_000_000  # one second in nanoseconds
H100 = "NVIDIA H100 80GB HBM3"


def gpu_job(job_id: str = "llmgw-qwen", *, gpus: int = 2, cores: int = 16,
            memory_mb: int = 196_608, fabric: str | None = "ib-a", count: int = 1,
            model: str = H100, provider: str | None = "nomad",
            meta: dict[str, str] | None = None) -> dict[str, Any]:
    service: dict[str, Any] = {
        "Name": job_id, "PortLabel": "http", "Tags": ["llmgw", f"model-{job_id}"],
        "Checks": [{"Name": "ready", "Type": "http", "Path": "/health",
                    "Interval": 10 * S, "Timeout": 3 * S}]}
    if provider is not None:
        service["Provider"] = provider
    job: dict[str, Any] = {
        "ID": job_id, "Type": "service", "Datacenters": ["dc1"],
        "Meta": meta if meta is not None else {"llmgw_model": job_id, "llmgw_fingerprint": "f1"},
        "Update": {"HealthCheck": "checks", "MinHealthyTime": 10 * S,
                   "HealthyDeadline": 1500 * S, "ProgressDeadline": 1800 * S, "MaxParallel": 1},
        "TaskGroups": [{
            "Name": "serve", "Count": count,
            "Networks": [{"Mode": "host", "DynamicPorts": [{"Label": "http", "To": 8000}]}],
            "Volumes": {"cache": {"Name": "cache", "Type": "host",
                                  "Source": "llmgw-model-cache"}},
            "Services": [service],
            "Tasks": [
                {"Name": "fetch", "Driver": "docker", "Config": {"image": "llmgw:0.1.0"},
                 "Lifecycle": {"Hook": "prestart", "Sidecar": False},
                 "Resources": {"CPU": 500, "MemoryMB": 1024},
                 "VolumeMounts": [{"Volume": "cache", "Destination": "/cache"}]},
                {"Name": "engine", "Driver": "docker",
                 "Config": {"image": "vllm/vllm-openai:v0.8.5", "ports": ["http"]},
                 "Resources": {"Cores": cores, "MemoryMB": memory_mb, "Devices": [{
                     "Name": "nvidia/gpu", "Count": gpus, "Constraints": [
                         {"LTarget": "${device.model}", "Operand": "=", "RTarget": model}]}]}},
            ]}],
    }
    if fabric is not None:
        job["TaskGroups"][0]["Constraints"] = [
            {"LTarget": "${meta.llmgw_fabric}", "Operand": "=", "RTarget": fabric}]
    return job


def cpu_job(job_id: str = "llmgw-tiny", *, cores: int = 8, memory_mb: int = 16_384,
            count: int = 1) -> dict[str, Any]:
    job = gpu_job(job_id, count=count, fabric=None)
    engine = job["TaskGroups"][0]["Tasks"][1]
    engine["Resources"] = {"Cores": cores, "MemoryMB": memory_mb}
    return job


def register(http: httpx.Client, job: dict[str, Any], **envelope: Any) -> httpx.Response:
    return http.post("/v1/jobs", json={"Job": copy.deepcopy(job), **envelope})


def task(job: dict[str, Any], name: str = "engine") -> dict[str, Any]:
    return next(t for t in job["TaskGroups"][0]["Tasks"] if t["Name"] == name)


def check(job: dict[str, Any]) -> dict[str, Any]:
    return job["TaskGroups"][0]["Services"][0]["Checks"][0]  # type: ignore[no-any-return]
