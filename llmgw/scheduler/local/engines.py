"""How a profile becomes an engine command line on this machine, and how its exit reads.

Pure: values in, argv and environment out; no process is started here.

llama.cpp runs as llama-cpp-python's OpenAI-compatible server
(``python -m llama_cpp.server``), vLLM as its OpenAI API server. Choices made
for llama.cpp, each because the default does something an operator would not
expect:

* ``--n_threads`` and ``--n_threads_batch`` are the profile's ``cpu_cores``:
  the reservation is the thread count, and the defaults use every CPU.
* ``--interrupt_requests false``: by default the server ends a running stream
  (with a normal ``[DONE]``, so it looks complete) as soon as another request
  arrives; behind a gateway that balances several clients onto one replica
  that would silently truncate answers.
* ``--logits_all false``: the server's default keeps every position's logits,
  a float per vocabulary entry per token of context (2 GiB for Gemma 3's
  262,144-entry vocabulary at 2,048 tokens), which makes a replica outgrow
  its memory reservation as soon as an answer is long. Only ``logprobs``
  needs them; a profile that wants those passes ``--logits_all true``.
* the chat format: a GGUF that carries a chat template gets it; one that does
  not (base models) gets the format of its architecture's family, because the
  server's fallback, ``llama-2``, makes a Gemma model answer an empty message.
* health is probed on ``/openapi.json``. The server has no health endpoint and
  binds its port only after the model has loaded, so any answer means ready;
  ``/v1/models`` would be the obvious choice but takes the model lock, so it
  waits behind every generation, and a probe arriving mid-stream counts as a
  "new request" for the interrupt rule above.

Arguments from the profile's ``engine_args`` come last, so an operator's
``--chat_format chatml`` or ``--n_batch`` wins over the choices above.
"""

from __future__ import annotations

import signal

import msgspec

from llmgw.catalog.adapter import vllm_lora_launch
from llmgw.catalog.model import Model, Profile
from llmgw.weights.gguf import GgufInfo

LLAMA_CPP_HEALTH = "/openapi.json"
VLLM_HEALTH = "/health"

# general.architecture → llama-cpp-python chat format, for GGUFs without a
# template. Only families whose turn markers are fixed are listed; anything
# else is left to the server's own choice.
_FAMILY_FORMATS = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "qwen": "qwen", "qwen2": "chatml", "qwen3": "chatml",
    "mistral": "mistral-instruct",
    "chatglm": "chatglm3",
}


class EngineLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """One engine start: its command line, environment additions and health path."""

    argv: list[str]
    env: dict[str, str]
    health_path: str
    port: int


def engine_refusal(model: Model, has_gpu: bool) -> str | None:
    """Why this machine can never run ``model``'s engine, or None."""
    if model.engine == "vllm" and not has_gpu:
        return (
            f"model {model.name!r} uses vLLM, which needs an NVIDIA GPU, and this machine has "
            "none; serve a GGUF of it with engine llama.cpp and a CPU profile (gpus: 0), or "
            "run it on Nomad"
        )
    return None


def chat_format_for(info: GgufInfo | None) -> str | None:
    """The ``--chat_format`` to pass, or None to let the server use the file's template."""
    if info is None or info.has_chat_template or not info.architecture:
        return None
    return _FAMILY_FORMATS.get(info.architecture.lower())


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def llama_cpp_launch(
    model: Model, profile: Profile, *, python: str, model_path: str, port: int,
    gguf: GgufInfo | None, gpu_indexes: tuple[int, ...] = (),
) -> EngineLaunch:
    threads = str(profile.cpu_cores or 1)
    argv = [
        python, "-m", "llama_cpp.server",
        "--model", model_path,
        "--model_alias", model.engine_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(profile.context),
        "--n_threads", threads,
        "--n_threads_batch", threads,
        "--interrupt_requests", "false",
        "--logits_all", "false",
    ]
    fmt = chat_format_for(gguf)
    if fmt and not _has_flag(profile.engine_args, "--chat_format"):
        argv += ["--chat_format", fmt]
    if profile.gpus > 0:
        argv += ["--n_gpu_layers", "-1"]
    argv += profile.engine_args
    env = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": threads,
        # A CPU profile holds no GPU: keep it off any the machine has.
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_indexes)),
        **profile.env,
    }
    return EngineLaunch(argv=argv, env=env, health_path=LLAMA_CPP_HEALTH, port=port)


def vllm_launch(
    model: Model, profile: Profile, *, python: str, model_path: str, port: int,
    gpu_indexes: tuple[int, ...],
) -> EngineLaunch:
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path,
        "--served-model-name", model.engine_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--tensor-parallel-size", str(max(profile.gpus, 1)),
        "--max-model-len", str(profile.context),
    ]
    if profile.quantization:
        argv += ["--quantization", profile.quantization]
    # A base with a lora block: adapters loaded at run time (llmgw.catalog.adapter).
    lora_args, lora_env = vllm_lora_launch(model, profile)
    argv += lora_args
    argv += profile.engine_args
    env = {"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_indexes)),
           **lora_env, **profile.env}
    if profile.cpu_cores:
        env.setdefault("OMP_NUM_THREADS", str(profile.cpu_cores))
    return EngineLaunch(argv=argv, env=env, health_path=VLLM_HEALTH, port=port)


def launch_for(
    model: Model, profile: Profile, *, python: str, model_path: str, port: int,
    gguf: GgufInfo | None = None, gpu_indexes: tuple[int, ...] = (),
) -> EngineLaunch:
    """The launch of ``model`` with ``profile`` on ``port``."""
    if model.engine == "vllm":
        return vllm_launch(model, profile, python=python, model_path=model_path, port=port,
                           gpu_indexes=gpu_indexes)
    return llama_cpp_launch(model, profile, python=python, model_path=model_path, port=port,
                            gguf=gguf, gpu_indexes=gpu_indexes)


def port_conflict(lines: list[str]) -> bool:
    """Whether the engine's output says its port was taken (uvicorn's and vLLM's wording)."""
    return any("address already in use" in line.lower() or "errno 98" in line.lower()
               for line in lines[-30:])


def explain_exit(returncode: int, lines: list[str], port: int) -> str:
    """One sentence on why an engine exited, from its exit status and its last lines."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = f"the engine was killed by {name}"
        if -returncode == signal.SIGKILL:
            why += " (by an operator, or by the kernel for lack of memory)"
        return why
    tail = "\n".join(lines[-30:]).lower()
    if port_conflict(lines):
        return (f"the engine could not listen on port {port}: another program took it; "
                "it is restarted on another port")
    if "no module named 'llama_cpp'" in tail or "no module named llama_cpp" in tail:
        return ("the engine is not installed: llama-cpp-python is missing from the Python "
                "that runs it; install llmgw with the local extra (pip install 'llmgw[local]') "
                "or set scheduler.local.python")
    if "no module named 'vllm'" in tail:
        return "the engine is not installed: vLLM is missing from the Python that runs it"
    if "failed to load model" in tail or "gguf_init" in tail:
        return (f"the engine could not load the model file (exit status {returncode}); the "
                "file may be corrupt or of a newer format than this llama.cpp reads")
    return f"the engine exited with status {returncode}"


def _without_traceback_frames(lines: list[str]) -> list[str]:
    """Python tracebacks minus their ``File …`` frames: the exception line is what says why."""
    out: list[str] = []
    in_frame = False
    for line in lines:
        if line.startswith('  File "'):
            in_frame = True
            continue
        if in_frame and line.startswith("    "):
            continue
        in_frame = False
        out.append(line)
    return out


def output_summary(lines: list[str], limit: int = 20) -> list[str]:
    """The engine's output lines worth showing on a failed replica.

    The last ``limit`` lines, with traceback frames left out, preceded by up
    to five earlier lines that report an error: llama.cpp says what was wrong
    with a model file some lines before the Python traceback that ends its run.
    """
    lines = _without_traceback_frames(lines)
    tail = lines[-limit:]
    earlier = [line for line in lines[:-limit] if "error" in line.lower()
               or "failed" in line.lower()][-5:]
    return [*earlier, "…", *tail] if earlier else tail
