"""How long rendering the Nomad jobs of a 2,000-model catalog takes (target: < 200 ms).

    .venv/bin/python bench/nomad_render.py [--models N] [--rounds R]

Renders every model of a synthetic catalog (a mix of multi-GPU vLLM models,
single-GPU ones with fabrics, and llama.cpp CPU models, as in
examples/server.yaml) to typed jobs, then encodes them to the JSON bodies
``PUT /v1/jobs`` takes. Prints the median and p95 of each step in
milliseconds, and their ratio to a baseline measured in the same run:
encoding the already-rendered jobs, the least any submission has to do.
"ui blocks" is what every reconciler pass adds to compare each job's ``ui`` block
(descriptions of 300 characters, with markup to escape, and all three links).
"""

from __future__ import annotations

import argparse
import statistics

from _timing import timed  # bench/ is on sys.path when a script here runs

from llmgw.catalog.build import DECLARED, build_catalog
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import NomadConfig
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad import jobui
from llmgw.scheduler.nomad.render import render_job

CLASSES = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB")),
           "l40s-48g": GpuClass(device="NVIDIA L40S", memory=Size.parse("46068MiB"))}
CFG = NomadConfig(namespace="llm", region="global", datacenters=["dc1"])
MIRROR = "http://mirror.internal:8070"
LINKS = jobui.Links(public_url="https://llmgw.internal",
                    dashboard_url="https://grafana.internal/d/llmgw/llmgw?var-model={model}")
DESCRIPTION = ("A *general* assistant [v2] for chat & code <fast>; " * 6)[:300]


def catalog_models(n: int) -> list[Model]:
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            p = Profile(name="h100-tp2", gpu_class="h100-80g", gpus=2, fabric="ib-a",
                        context=32768, cpu_cores=16, memory=Size.parse("192GiB"),
                        engine_args=["--enable-prefix-caching"])
            out.append(Model(name=f"llm-{i}", source=Source.parse(f"hf://org/model-{i}@main"),
                             engine="vllm", description=DESCRIPTION,
                             served_name=f"org/model-{i}", profiles=[p], scaling=Scaling(min=2)))
        elif kind == 1:
            p = Profile(name="l40s-1", gpu_class="l40s-48g", gpus=1, context=16384,
                        cpu_cores=8, memory=Size.parse("64GiB"), quantization="fp8")
            out.append(Model(name=f"llm-{i}", source=Source.parse(f"{MIRROR}/model-{i}/v1/"),
                             engine="vllm",
                             profiles=[p], scaling=Scaling(min=1)))
        else:
            p = Profile(name="cpu-8", gpus=0, context=8192, cpu_cores=8, memory=Size.parse("4GiB"),
                        engine_args=["--embedding"])
            out.append(Model(name=f"llm-{i}",
                             source=Source.parse(f"{MIRROR}/model-{i}/q8_0/m.gguf"),
                             engine="llama.cpp", profiles=[p], scaling=Scaling(min=0)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    catalog = build_catalog(catalog_models(args.models), CLASSES)
    models = list(catalog)

    def render_all() -> list[js.Job]:
        return [render_job(m, m.profiles[0], CFG, CLASSES, m.scaling.min, MIRROR)
                for m in models]

    jobs = render_all()

    def ui_blocks() -> list[str]:
        return [jobui.key(jobui.ui_block(m, m.profiles[0], LINKS, DECLARED)) for m in models]

    def render_with_ui() -> list[js.Job]:
        return [render_job(m, m.profiles[0], CFG, CLASSES, m.scaling.min, MIRROR,
                           ui=jobui.ui_block(m, m.profiles[0], LINKS, DECLARED))
                for m in models]

    def encode_all() -> list[bytes]:
        return [js.encode(js.JobRegisterRequest(Job=j)) for j in jobs]

    def render_and_encode() -> list[bytes]:
        return [js.encode(js.JobRegisterRequest(Job=j)) for j in render_all()]

    base = timed(encode_all, args.rounds)
    rows = [("encode only (baseline)", base), ("render", timed(render_all, args.rounds)),
            ("render + encode", timed(render_and_encode, args.rounds)),
            ("ui blocks", timed(ui_blocks, args.rounds)),
            ("render with ui block", timed(render_with_ui, args.rounds))]
    base_median = statistics.median(base)
    print(f"{args.models} jobs, {args.rounds} rounds; target: render < 200 ms")
    for name, samples in rows:
        med = statistics.median(samples)
        p95 = sorted(samples)[int(0.95 * (len(samples) - 1))]
        print(f"  {name:<24} median {med:7.1f} ms   p95 {p95:7.1f} ms   "
              f"x{med / base_median:5.1f} of baseline")


if __name__ == "__main__":
    main()
