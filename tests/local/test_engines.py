"""Engine command lines and exit explanations (pure), and the chat format a GGUF gets."""

from __future__ import annotations

import signal
from pathlib import Path

from llmgw.catalog.model import Model, Profile
from llmgw.catalog.source import Source
from llmgw.scheduler.local.engines import (
    LLAMA_CPP_HEALTH,
    chat_format_for,
    engine_refusal,
    explain_exit,
    launch_for,
    output_summary,
    port_conflict,
)
from llmgw.weights.gguf import GgufInfo, read_gguf

from .conftest import cpu_model

GEMMA3_BASE = GgufInfo(version=3, metadata={"general.architecture": "gemma3"})


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_llama_cpp_threads_and_context_come_from_the_profile() -> None:
    """cpu_cores becomes both thread counts, context becomes n_ctx, bound to loopback."""
    m = cpu_model("gemma", cores=2, context=2048)
    launch = launch_for(m, m.profiles[0], python="/py", model_path="/m.gguf", port=28001,
                        gguf=GEMMA3_BASE)
    argv = launch.argv
    assert argv[:3] == ["/py", "-m", "llama_cpp.server"]
    assert arg(argv, "--model") == "/m.gguf"
    assert arg(argv, "--host") == "127.0.0.1"
    assert arg(argv, "--port") == "28001"
    assert arg(argv, "--n_threads") == arg(argv, "--n_threads_batch") == "2"
    assert arg(argv, "--n_ctx") == "2048"
    assert arg(argv, "--model_alias") == "gemma"
    assert launch.env["OMP_NUM_THREADS"] == "2"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == ""
    assert launch.health_path == LLAMA_CPP_HEALTH


def test_a_new_request_does_not_cut_a_running_stream() -> None:
    """The server's default of interrupting a stream on every new request is turned off."""
    m = cpu_model("gemma")
    argv = launch_for(m, m.profiles[0], python="p", model_path="m", port=1).argv
    assert arg(argv, "--interrupt_requests") == "false"


def test_the_engine_does_not_keep_every_positions_logits() -> None:
    """logits_all would grow a replica by n_ctx x vocabulary floats, past its reservation."""
    m = cpu_model("gemma")
    argv = launch_for(m, m.profiles[0], python="p", model_path="m", port=1).argv
    assert arg(argv, "--logits_all") == "false"


def test_a_gemma_gguf_without_a_template_gets_the_gemma_chat_format() -> None:
    """The server's llama-2 fallback answers a Gemma model with an empty message."""
    assert chat_format_for(GEMMA3_BASE) == "gemma"
    m = cpu_model("gemma")
    argv = launch_for(m, m.profiles[0], python="p", model_path="m", port=1,
                      gguf=GEMMA3_BASE).argv
    assert arg(argv, "--chat_format") == "gemma"


def test_a_gguf_with_its_own_template_keeps_it() -> None:
    """No --chat_format is passed when the file carries a chat template."""
    info = GgufInfo(version=3, metadata={"general.architecture": "gemma3"},
                    has_chat_template=True)
    assert chat_format_for(info) is None
    assert chat_format_for(None) is None
    assert chat_format_for(GgufInfo(version=3, metadata={"general.architecture": "exotic"})) is None


def test_engine_args_from_the_profile_come_last_and_win() -> None:
    """An operator's --chat_format replaces the chosen one; other args are appended."""
    m = cpu_model("gemma", engine_args=["--chat_format", "chatml", "--n_batch", "64"])
    argv = launch_for(m, m.profiles[0], python="p", model_path="m", port=1,
                      gguf=GEMMA3_BASE).argv
    assert argv.count("--chat_format") == 1
    assert argv[-4:] == ["--chat_format", "chatml", "--n_batch", "64"]


def test_vllm_is_refused_on_a_machine_without_a_gpu() -> None:
    """The refusal names vLLM, the missing GPU and what to do instead."""
    m = Model(name="big", source=Source.parse("/models/big"), engine="vllm",
              profiles=[Profile(name="l40s", gpu_class="l40s", gpus=1)])
    reason = engine_refusal(m, has_gpu=False)
    assert reason is not None
    assert "vLLM, which needs an NVIDIA GPU, and this machine has none" in reason
    assert engine_refusal(m, has_gpu=True) is None
    assert engine_refusal(cpu_model("small"), has_gpu=False) is None


def test_vllm_gets_its_gpus_and_tensor_parallel_size() -> None:
    """A vLLM launch sees exactly the reserved cards and shards across all of them."""
    m = Model(name="big", source=Source.parse("/models/big"), engine="vllm", served_name="org/Big",
              profiles=[Profile(name="tp2", gpu_class="l40s", gpus=2, context=8192,
                                quantization="fp8")])
    launch = launch_for(m, m.profiles[0], python="p", model_path="/models/big", port=5,
                        gpu_indexes=(2, 3))
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert arg(launch.argv, "--tensor-parallel-size") == "2"
    assert arg(launch.argv, "--max-model-len") == "8192"
    assert arg(launch.argv, "--served-model-name") == "org/Big"
    assert launch.health_path == "/health"


UVICORN_PORT_TAKEN = [
    "INFO:     Waiting for application startup.",
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 28001): "
    "address already in use",
]


def test_an_exit_explains_a_port_taken_while_loading() -> None:
    """uvicorn's bind error is recognised as a port conflict, not a crash."""
    assert port_conflict(UVICORN_PORT_TAKEN)
    assert "could not listen on port 28001" in explain_exit(1, UVICORN_PORT_TAKEN, 28001)


def test_an_exit_explains_a_kill_and_a_missing_engine() -> None:
    """Signals, a missing llama-cpp-python and a bad model file each get their sentence."""
    assert "killed by SIGKILL" in explain_exit(-signal.SIGKILL, [], 1)
    missing = ["ModuleNotFoundError: No module named 'llama_cpp'"]
    assert "pip install 'llmgw[local]'" in explain_exit(1, missing, 1)
    bad = ["gguf_init_from_file_impl: failed to read key-value pairs",
           "ValueError: Failed to load model from file: /m.gguf"]
    assert "could not load the model file" in explain_exit(1, bad, 1)
    assert explain_exit(3, ["whatever"], 1) == "the engine exited with status 3"


def test_a_failed_engine_shows_its_error_lines_not_traceback_frames() -> None:
    """llama.cpp's reason, printed before the traceback, is kept; the frames are dropped."""
    lines = [
        "llama_model_loader: - kv  0: general.architecture str = gemma3",
        "gguf_init_from_reader: failed to read key-value pairs",
        *[f"llama_model_loader: - kv {i}: filler" for i in range(30)],
        "Traceback (most recent call last):",
        '  File "/site-packages/llama_cpp/llama.py", line 388, in __init__',
        "    internals.LlamaModel(",
        "ValueError: Failed to load model from file: /m.gguf",
    ]
    shown = output_summary(lines, limit=3)
    assert shown == ["gguf_init_from_reader: failed to read key-value pairs", "…",
                     "llama_model_loader: - kv 29: filler", "Traceback (most recent call last):",
                     "ValueError: Failed to load model from file: /m.gguf"]
    assert output_summary(["a", "b"], limit=5) == ["a", "b"]


def test_the_shipped_gemma_is_a_gemma3_base_model_without_a_template(gemma_path: Path) -> None:
    """The README's model needs the gemma chat format chosen for it."""
    info = read_gguf(gemma_path)
    assert info is not None
    assert info.architecture == "gemma3"
    assert not info.has_chat_template
    assert chat_format_for(info) == "gemma"


def test_a_vllm_base_with_a_lora_block_loads_adapters_at_run_time() -> None:
    """The embedded vLLM gets the same LoRA flags and switch as on Nomad."""
    from llmgw.catalog.model import Lora

    m = Model(name="big", source=Source.parse("/models/big"), engine="vllm",
              lora=Lora(slots=2), profiles=[Profile(name="g", gpu_class="l40s", gpus=1)])
    launch = launch_for(m, m.profiles[0], python="p", model_path="/models/big", port=5,
                        gpu_indexes=(0,))
    assert "--enable-lora" in launch.argv
    assert arg(launch.argv, "--max-loras") == "2"
    assert arg(launch.argv, "--max-lora-rank") == "16"
    assert arg(launch.argv, "--max-cpu-loras") == "8"
    assert launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
