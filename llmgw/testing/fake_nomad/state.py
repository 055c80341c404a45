"""The fake's state store: tables, a raft-like index, and blocking queries.

Every write takes the next index (Nomad's raft index) and stamps the tables it touched,
the way memdb tracks a per-table index. Reads report the index of the table(s) they
read, floored at 1 (nomad/server.go ``blockingRPC``), and a blocking query
(``?index=N&wait=…``) sleeps until that index exceeds N or the wait runs out
(docs/nomad-api.md §4.3): a change anywhere in a table wakes every watcher of that table,
and returning does not guarantee the part you care about changed.

One condition variable guards everything. Handlers hold it only to read or write; a
blocking query waits on it, which releases it, so a long poll never stalls a writer.

The store also keeps the fake's clock (``now``): wall time plus whatever tests have
skipped ahead with ``FakeNomad.advance``, so a deadline of hours can pass in a test
without anyone waiting for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from llmgw.testing.fake_nomad.checkwatch import Watch
from llmgw.testing.fake_nomad.records import (
    Alloc,
    CheckResult,
    Deployment,
    Eval,
    JobRecord,
    Node,
    ServiceReg,
)
from llmgw.testing.fake_nomad.shutdown import Stopping

TABLES = ("nodes", "jobs", "job_summary", "job_version", "evals", "allocs", "deployment",
          "service_registrations", "scaling_event")


class Store:
    def __init__(self, nodes: list[Node], namespaces: set[str]) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.index = 0
        self.table_index: dict[str, int] = dict.fromkeys(TABLES, 0)
        self.namespaces = set(namespaces)
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[tuple[str, str], JobRecord] = {}
        self.evals: dict[str, Eval] = {}
        self.allocs: dict[str, Alloc] = {}
        self.deployments: dict[str, Deployment] = {}
        self.services: dict[str, ServiceReg] = {}
        self.checks: dict[str, dict[str, CheckResult]] = {}
        # alloc ID → check ID → the client's check_restart watch (checkwatch.py)
        self.watches: dict[str, dict[str, Watch]] = {}
        # JobSummary.Queued: the queued counts of the job's latest processed evaluation
        self.queued: dict[tuple[str, str], dict[str, int]] = {}
        self.skipped_ns = 0
        # alloc ID → where its kill sequence is (shutdown.py)
        self.stopping: dict[str, Stopping] = {}
        # (alloc ID, task) → the loopback address a workload of that task listens on
        self.listening: dict[tuple[str, str], tuple[str, int]] = {}
        for node in nodes:
            idx = self.write("nodes")
            node.create_index = node.modify_index = idx
            node.status_updated_at = self.now()
            self.nodes[node.id] = node

    def now(self) -> int:
        """The fake's clock in Unix nanoseconds: wall time plus what ``advance`` skipped."""
        return time.time_ns() + self.skipped_ns

    def write(self, *tables: str) -> int:
        """Take the next index for a write to ``tables``; the caller holds ``cond``."""
        with self.cond:
            self.index += 1
            for t in tables:
                self.table_index[t] = self.index
            self.cond.notify_all()
            return self.index

    def read_index(self, *tables: str) -> int:
        return max(1, *(self.table_index[t] for t in tables))

    def wait(self, current: Callable[[], int], min_index: int, timeout: float) -> None:
        """Block until ``current()`` exceeds ``min_index`` or ``timeout`` seconds pass.

        Index 0 means "do not block" (hashicorp/nomad#6403). Caller holds ``cond``.
        """
        if min_index <= 0:
            return
        deadline = time.monotonic() + timeout
        while current() <= min_index:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.cond.wait(remaining)

    def job_allocs(self, namespace: str, job_id: str) -> list[Alloc]:
        return [a for a in self.allocs.values()
                if a.namespace == namespace and a.job_id == job_id]

    def job_evals(self, namespace: str, job_id: str) -> list[Eval]:
        return [e for e in self.evals.values() if e.namespace == namespace and e.job_id == job_id]

    def job_deployments(self, namespace: str, job_id: str) -> list[Deployment]:
        found = [d for d in self.deployments.values()
                 if d.namespace == namespace and d.job_id == job_id]
        return sorted(found, key=lambda d: d.create_index, reverse=True)

    def latest_deployment(self, namespace: str, job_id: str) -> Deployment | None:
        found = self.job_deployments(namespace, job_id)
        return found[0] if found else None

    def node_by_name(self, name: str) -> Node:
        for node in self.nodes.values():
            if name in (node.name, node.id):
                return node
        known = ", ".join(sorted(n.name for n in self.nodes.values()))
        raise KeyError(f"no node named {name!r} in the fake cluster; nodes are: {known}")

    def job_status(self, rec: JobRecord) -> str:
        """GetJobStatus (nomad/state): running while an alloc is live, pending while an
        eval is unfinished (blocked included), dead once everything is terminal."""
        allocs = self.job_allocs(rec.namespace, rec.id)
        if any(not a.terminal for a in allocs):
            return "running"
        evals = self.job_evals(rec.namespace, rec.id)
        if any(e.status not in ("complete", "failed", "canceled") for e in evals):
            return "pending"
        return "dead" if evals or allocs else "pending"

    def summary(self, rec: JobRecord) -> dict[str, object]:
        groups: dict[str, dict[str, int]] = {}
        for tg in rec.spec.get("TaskGroups", []):
            groups[tg["Name"]] = dict.fromkeys(
                ("Queued", "Complete", "Failed", "Running", "Starting", "Lost", "Unknown"), 0)
        for a in self.job_allocs(rec.namespace, rec.id):
            g = groups.setdefault(a.task_group, dict.fromkeys(
                ("Queued", "Complete", "Failed", "Running", "Starting", "Lost", "Unknown"), 0))
            key = {"pending": "Starting", "running": "Running", "complete": "Complete",
                   "failed": "Failed", "lost": "Lost", "unknown": "Unknown"}[a.client_status]
            g[key] += 1
        for tg, n in self.queued.get((rec.namespace, rec.id), {}).items():
            if tg in groups:
                groups[tg]["Queued"] = n
        return {"JobID": rec.id, "Namespace": rec.namespace, "Summary": groups,
                "Children": {"Pending": 0, "Running": 0, "Dead": 0},
                "CreateIndex": rec.create_index, "ModifyIndex": self.read_index("job_summary")}
