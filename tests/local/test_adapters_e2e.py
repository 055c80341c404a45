"""Adapters end to end on the embedded scheduler: `llmgw serve`, a simulated vLLM, `openai`.

llmgw runs as a separate process, as an operator starts it. The machine is
given one GPU by an ``nvidia-smi`` on PATH that reports an L40S, and "vLLM" is
the simulated engine behind vLLM's own command line (``llmgw.testing.simvllm``),
found through the engine's PYTHONPATH: so the replica is started by the real
scheduler with the real flags, and serves adapters only if it was given
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``. The adapter is added
at run time with ``llmgw ctl adapter add``; the base's replica is not restarted.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.testing.simvllm import write_vllm_shim

from .test_e2e_serve import TOKEN, Served, wait_for

pytestmark = pytest.mark.slow

CONFIG = """
listen: 127.0.0.1:8080
scheduler:
  kind: local
  local:
    port_range: [{low}, {high}]
gpu_classes:
  l40s: {{device: NVIDIA L40S, memory: 46068MiB}}
models:
  - name: qwen
    source: {base}
    engine: vllm
    served_name: Qwen/Qwen2.5-7B-Instruct
    lora: {{slots: 2, max_rank: 16, cpu_slots: 4}}
    profiles:
      - name: l40s
        gpu_class: l40s
        gpus: 1
        cpu_cores: 1
        memory: 1GiB
        env:
          PYTHONPATH: "{shim}"
          LLMGW_SIM_SPEC: '{{"step_time": 0.002, "lora_load_time": 0.3}}'
adapters:
  - name: qwen-sql
    base: qwen
    source: {sql}
    rank: 8
"""


def adapter(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "adapters" / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return path


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA L40S, 46068'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    base = tmp_path / "models" / "qwen"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    low = 31000 + (os.getpid() % 80) * 50
    config = tmp_path / "server.yaml"
    config.write_text(CONFIG.format(low=low, high=low + 49, base=base,
                                    shim=write_vllm_shim(tmp_path / "shim"),
                                    sql=adapter(tmp_path, "sql")))
    s = Served(tmp_path, config=config)
    try:
        wait_for(lambda: s.printed("listening") or s.proc.poll() is not None, "llmgw to listen")
        assert s.proc.poll() is None, s.diagnose()
        yield s
    finally:
        s.stop()
        s.close()


def test_two_adapters_of_one_base_answer_through_the_openai_client(served: Served,
                                                                   tmp_path: Path) -> None:
    """A declared adapter and one added at run time are each answered by themselves, on
    the one replica of the base that was started with LoRA enabled, never restarted."""
    try:
        wait_for(lambda: any(r.get("healthy") for r in served.replicas("qwen")),
                 "the base's replica", 40)
    except AssertionError:
        raise AssertionError(served.diagnose()) from None
    [engine] = served.engines("qwen")
    line = subprocess.run(["cat", f"/proc/{engine}/cmdline"], capture_output=True,
                          check=True).stdout.replace(b"\0", b" ").decode()
    assert "--enable-lora --max-loras 2 --max-lora-rank 16 --max-cpu-loras 4" in line
    runner = CliRunner()
    added = runner.invoke(main, ["ctl", "--url", served.url, "--token", TOKEN, "adapter",
                                 "add", "qwen-support", "--base", "qwen", "--source",
                                 str(adapter(tmp_path, "support")), "--rank", "8"])
    assert added.exit_code == 0, added.output
    listed = runner.invoke(main, ["ctl", "--url", served.url, "--token", TOKEN, "adapter",
                                  "list"])
    assert "qwen-sql" in listed.output
    assert "qwen-support" in listed.output
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    for name in ("qwen-sql", "qwen-support", "qwen-sql"):
        answer = client.chat.completions.create(
            model=name, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert answer.model == name
        assert answer.choices[0].message.content
    stream = client.chat.completions.create(model="qwen-support", max_tokens=4, stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    models = {m.id: m for m in client.models.list()}
    assert models["qwen-support"].model_extra == {"parent": "qwen"}
    engines = httpx.get(f"{served.url}/api/v1/replicas", params={"model": "qwen"},
                        headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert len(engines) == 1
    assert served.engines("qwen") == [engine]       # the same process: nothing restarted
