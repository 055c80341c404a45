"""The fake Nomad's batch fetch tasks run for real: ``llmgw fetch`` into a node's disk.

The fake has no clients, so a batch job's main task stays ``running`` until a test
ends it. ``FetchTasks`` plays the Docker driver for the tasks that run ``llmgw
fetch`` (an adapter's fetch, a prefetch): for each such allocation that starts, it
runs the task's own command line as a process — its destination mapped onto the
node's directory as the task's host-volume mount shows it
(``nomad_vllm.host_mounts``), its ``${NOMAD_ALLOC_DIR}`` a directory of its own —
then leaves the progress file in the allocation's directory for the client fs API
(``write_alloc_file``) and ends the allocation by the exit code: 0 completes it,
anything else fails it with the ``Terminated`` event "Exit Code: N" the task runner
records of the driver's exit result (client/allocrunner/taskrunner/task_runner.go
``emitExitResultEvent``); a batch group with no restart attempts left then fails
the allocation. So what
reaches the node is what the real fetcher brings from the real mirror, verified the
way it verifies, and a fetch that fails says why the way it would on Nomad.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from llmgw.testing.nomad_vllm import host_mounts

_ALLOC_DIR = "${NOMAD_ALLOC_DIR}"


class FetchTasks:
    """Runs each started ``llmgw fetch`` main task of the jobs named ``prefixes``."""

    def __init__(self, nomad: Any, disks: Mapping[str, Path],
                 prefixes: tuple[str, ...] = ("llmgw_adapter_", "llmgw_prefetch_"),
                 *, interval: float = 0.1) -> None:
        self.nomad = nomad
        self.disks = dict(disks)
        self.prefixes = prefixes
        self.interval = interval
        self.ran: list[tuple[str, list[str], int]] = []     # alloc, argv, exit code
        self.seconds: dict[str, float] = {}                  # alloc → the fetch's run time
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._work = tempfile.TemporaryDirectory(prefix="llmgw-fetch-tasks-")
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> FetchTasks:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._work.cleanup()

    def _watch(self) -> None:
        with httpx.Client(base_url=self.nomad.address, timeout=10) as http:
            while not self._stop.wait(self.interval):
                try:
                    jobs = [j["ID"] for p in self.prefixes
                            for j in http.get("/v1/jobs", params={"prefix": p}).json()]
                except (httpx.HTTPError, ValueError):
                    continue
                for jid in jobs:
                    for a in self.nomad.allocations(jid):
                        if a.id in self._seen or a.client_status != "running":
                            continue
                        task = self._fetch_task(a)
                        if task is not None:
                            self._seen.add(a.id)
                            threading.Thread(target=self._run, args=(a, *task),
                                             daemon=True).start()

    @staticmethod
    def _fetch_task(a: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        group = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
        for task in group.get("Tasks", []):
            config = task.get("Config") or {}
            args = config.get("args") or []
            if config.get("command") == "llmgw" and args[:1] == ["fetch"] \
                    and not task.get("Lifecycle") \
                    and a.task_states[task["Name"]].state == "running":
                return group, task
        return None

    def _run(self, a: Any, group: dict[str, Any], task: dict[str, Any]) -> None:
        alloc_dir = Path(self._work.name) / a.id
        alloc_dir.mkdir()
        mounts = host_mounts(self.nomad, self.disks, a.node_id, group, task)
        def mapped(arg: str) -> str:
            arg = arg.replace(_ALLOC_DIR, str(alloc_dir))
            for inside, outside in mounts.items():
                if arg == inside or arg.startswith(inside.rstrip("/") + "/"):
                    return outside + arg[len(inside.rstrip("/")):]
            return arg

        args = [mapped(a) for a in task["Config"]["args"]]
        argv = [sys.executable, "-m", "llmgw", *args, "--quiet"]
        started = time.perf_counter()
        code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              check=False, timeout=300).returncode
        self.seconds[a.id] = time.perf_counter() - started
        self.ran.append((a.id, argv, code))
        for f in alloc_dir.iterdir():
            if not f.name.endswith(".tmp"):
                self.nomad.write_alloc_file(a.id, f"alloc/{f.name}", f.read_bytes())
        if code == 0:
            self.nomad.complete_alloc(a.id)
        else:
            self.nomad.fail_alloc(a.id, f"Exit Code: {code}")
