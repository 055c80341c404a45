"""The fake Nomad's engine tasks run as the job says: vLLM's flags, the simulated engine.

``SimWorkloads`` (``llmgw.testing.chaos_nomad``) starts a simulated engine
with settings the test chose. ``JobWorkloads`` starts one with the settings
the *rendered job* chose: it reads the allocation's engine task from the job
the fake holds — ``Config.args`` and ``Env`` — and runs
``llmgw.testing.simvllm`` with those arguments (``--port`` and ``--host``
replaced by a free loopback port, the address the task's service registers,
as a Nomad client maps a port label) and that environment. So a job that
forgot ``--enable-lora`` or ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` runs an
engine that serves no adapters, as vLLM would.

With ``disks`` (node name → a directory standing for that node's host volumes,
one subdirectory per volume name) the engine reads what the task's volume mounts
show, as the Docker driver bind-mounts a host volume at the mount's
``Destination``: an adapter path under ``/llmgw-cache`` is found on that node's
disk or not at all, so only an adapter fetched onto the replica's own node loads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from llmgw.testing.chaos import free_port
from llmgw.testing.simengine import SimSpec


def _without(args: list[str], flags: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        out.append(a)
    return out


def host_mounts(nomad: Any, disks: Mapping[str, Path], node_id: str, group: dict[str, Any],
                task: dict[str, Any]) -> dict[str, str]:
    """A task's host-volume mounts on ``node_id``: its ``VolumeMounts`` destinations, each
    the test's directory for the node's host volume the group's volume request names
    (``Source``), as the client's volume hook resolves them
    (client/allocrunner/taskrunner/volume_hook.go ``prepareHostVolumes``)."""
    node = next((n for n in nomad.nodes if n.id == node_id), None)
    disk = disks.get(node.name) if node is not None else None
    if node is None or disk is None:
        return {}
    out = {}
    for mount in task.get("VolumeMounts") or ():
        request = (group.get("Volumes") or {}).get(mount.get("Volume"), {})
        if request.get("Type") == "host" and request.get("Source") in node.host_volumes:
            out[mount["Destination"]] = str(disk / request["Source"])
    return out


class JobWorkloads:
    """Each allocation's engine task: the simulated engine behind the job's vLLM command."""

    def __init__(self, spec: SimSpec, jobs: list[str],
                 disks: Mapping[str, Path] | None = None) -> None:
        self.spec = spec
        self.disks = dict(disks or {})
        self.jobs = jobs                     # the job IDs whose engines it runs
        self.nomad: Any = None               # the FakeNomad, set once it exists
        self._lock = threading.Lock()
        self.running: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        self.launched: dict[str, tuple[list[str], dict[str, str]]] = {}   # alloc → argv, env
        self._exited: list[subprocess.Popen[bytes]] = []

    def _task(self, alloc_id: str, task: str) -> tuple[dict[str, Any], dict[str, str]]:
        """The task's spec, and its mounts (destination → directory on the test's disk)."""
        for job in self.jobs:
            for a in self.nomad.allocations(job):
                if a.id == alloc_id:
                    group = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
                    found: dict[str, Any] = next(t for t in group["Tasks"]
                                                 if t["Name"] == task)
                    return found, host_mounts(self.nomad, self.disks, a.node_id, group, found)
        raise LookupError(f"no allocation {alloc_id}")

    def start(self, alloc_id: str, task: str) -> tuple[str, int]:
        spec, mounts = self._task(alloc_id, task)
        port = free_port()
        args = [*_without(list(spec["Config"].get("args", [])), ("--port", "--host")),
                "--host", "127.0.0.1", "--port", str(port)]
        env = {k: str(v) for k, v in (spec.get("Env") or {}).items()}
        argv = [sys.executable, "-m", "llmgw.testing.simvllm", *args]
        proc = subprocess.Popen(argv, env={**os.environ, **env,
                                           "LLMGW_SIM_SPEC": msgspec.json.encode(
                                               msgspec.structs.replace(self.spec, mounts=mounts)
                                           ).decode()},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with self._lock:
            self.running[alloc_id] = (proc, f"http://127.0.0.1:{port}")
            self.launched[alloc_id] = (args, env)
        return "127.0.0.1", port

    def stop(self, alloc_id: str) -> None:
        with self._lock:
            proc, _ = self.running.pop(alloc_id, (None, ""))
            if proc is not None:
                self._exited.append(proc)
        if proc is not None:
            proc.send_signal(signal.SIGTERM)

    def urls(self) -> dict[str, str]:
        with self._lock:
            return {a: url for a, (_, url) in self.running.items()}

    def close(self) -> None:
        with self._lock:
            procs = [p for p, _ in self.running.values()] + self._exited
            self.running.clear()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
