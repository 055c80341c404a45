"""Measuring this machine: CPU ids, memory and NVIDIA GPUs, with configured overrides.

The only module of the local scheduler that asks the operating system what the
hardware is; ``resources.py`` does the arithmetic on what this returns.

Cores are the CPUs this process may run on (``sched_getaffinity``), not the
machine's total, so llmgw started under ``taskset`` or in a container limited
to some CPUs does not hand out cores it cannot use. GPUs come from
``nvidia-smi`` when it is installed; without it the machine has none, which is
what makes a vLLM profile unplaceable here.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess

from llmgw.config import LocalConfig
from llmgw.scheduler.local.resources import Gpu, Machine

log = logging.getLogger("llmgw.scheduler.local")


def _cpu_ids() -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def _memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,memory.total`` in CSV, no header or units."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        try:
            memory = int(float(parts[2]) * 1024 * 1024)  # MiB
        except ValueError:
            continue
        gpus.append(Gpu(index=int(parts[0]), device=parts[1], memory=memory))
    return tuple(gpus)


def _gpus() -> tuple[Gpu, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi is installed but did not list GPUs (%s); "
                    "counting no GPU on this machine", exc)
        return ()
    return parse_nvidia_smi(out)


def detect_machine(cfg: LocalConfig) -> Machine:
    """This machine, with ``scheduler.local.cpu_cores``/``memory`` overriding what was measured."""
    cores = _cpu_ids()
    pinnable = True
    if cfg.cpu_cores is not None:
        if cfg.cpu_cores <= len(cores):
            cores = cores[: cfg.cpu_cores]
        else:
            # More than the machine has: an operator's deliberate over-commit.
            # The ids are then only counters, and engines are not pinned.
            cores = tuple(range(cfg.cpu_cores))
            pinnable = False
    memory = _memory()
    if cfg.memory is not None:
        memory = int(cfg.memory)
    return Machine(name=socket.gethostname() or "localhost", cores=cores, memory=memory,
                   gpus=_gpus(), pinnable=pinnable)
