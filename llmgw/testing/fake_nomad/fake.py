"""``FakeNomad``: a Nomad server on loopback for tests, with handles to play its clients.

    with FakeNomad(nodes=default_fleet()) as nomad:
        httpx.post(f"{nomad.address}/v1/jobs", json={"Job": job})
        nomad.settle()                          # the scheduler worker has caught up
        [alloc] = nomad.allocations("llmgw-qwen")
        nomad.set_check(alloc.id, "success")    # the replica's health check passes

What the fake does on its own, and what is left to the test:

* evaluations run on a background worker, as in Nomad; ``settle()`` waits for it;
* placed allocations start ``pending``; with ``auto_run=True`` (the default) the
  client moves them to ``running`` right after (a separate index), otherwise call
  ``run_alloc`` — with ``through_prestart=False`` the prestart fetch keeps running
  until ``finish_prestart``. Group services are registered at placement (the client's
  ``Prerun``), before checks pass; task services when their task has started;
* ``check_restart`` restarts a workload whose check is still failing once the grace
  that began at its service's registration is over — evaluated when ``advance`` moves
  the clock;
* every Nomad-provider check starts ``pending`` and stays so until ``set_check`` /
  ``set_job_checks`` changes it — nothing probes real endpoints;
* a deployment stays ``running`` until all its allocations are healthy (running, and
  with ``HealthCheck: checks`` every healthiness check ``success``), until
  ``finish_deployment``, or until its progress deadline passes on the fake's clock
  (``advance``) with too few healthy — then it fails, and Nomad places nothing more of
  that job version; while it runs, ``POST /v1/job/:id/scale`` is refused;
* a stopped allocation's services leave first, then it waits its group's and its
  tasks' ``shutdown_delay`` (in real time, or when ``advance`` passes it) before its
  tasks are killed and it turns ``complete`` (``shutdown``);
* with ``workloads`` something real runs each main task that has services (a
  simulated engine, say): started when the task starts, its loopback address is what
  the task's services register, and stopped when the allocation's tasks die
  (``llmgw.testing.nomad_vllm.JobWorkloads`` runs the job's own vLLM command line,
  reading through the task's host-volume mounts); a batch job's main task runs until
  ``complete_alloc`` or ``fail_alloc`` (``llmgw.testing.nomad_fetch.FetchTasks``
  runs its ``llmgw fetch`` for real and ends it by the exit code);
* ``fail_alloc``, ``set_alloc_memory``, ``set_node`` play client and node events; new
  dynamic node metadata reaches the servers (``node(name).meta``, placement) only when
  the client's batched re-register lands, 5–10 s later on the fake's clock;
* a host volume's directory has an owner and mode (``records.HostVolume``): a task
  whose user (``User``, else its image's, from ``image_users``, else root) may not write
  it fails at start; a node whose volume path is missing never registers (``volumes``);
* ``inject`` answers matching requests with any status and body (errors, garbage);
  ``requests`` records every request received.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from llmgw.testing.fake_nomad import (
    acl,
    acl_routes,
    checkwatch,
    clientapi,
    deployments,
    lifecycle,
    routes_cluster,
    routes_jobs,
    shutdown,
    variables,
)
from llmgw.testing.fake_nomad.cluster import Cluster, Workloads
from llmgw.testing.fake_nomad.fixtures import default_fleet
from llmgw.testing.fake_nomad.records import Alloc, Deployment, Eval, Node, ServiceReg
from llmgw.testing.fake_nomad.server import Api, HttpApp, Injection, RecordedRequest


class FakeNomad:
    def __init__(self, nodes: Sequence[Node] | None = None, *, acl_token: str | None = None,
                 acls: bool = False, strict: bool = True, auto_run: bool = True,
                 namespaces: Iterable[str] = ("default",), region: str = "global",
                 host: str = "127.0.0.1", port: int = 0,
                 workloads: Workloads | None = None,
                 image_users: dict[str, int] | None = None) -> None:
        fleet = list(nodes) if nodes is not None else default_fleet()
        self._cluster = Cluster(fleet, namespaces=set(namespaces), auto_run=auto_run,
                                workloads=workloads, image_users=image_users)
        self._acls = acl.Registry(management={acl_token} if acl_token else set()) \
            if acl_token is not None or acls else None
        self._api = Api(self._cluster, strict=strict, region=region, acls=self._acls)
        self._http = HttpApp(self._api, routes_jobs.ROUTES + routes_cluster.ROUTES
                             + variables.ROUTES + clientapi.ROUTES + acl_routes.ROUTES)
        self._host, self._port = host, port
        self._closed = False

    # -- server lifecycle ----------------------------------------------------------
    def start(self) -> FakeNomad:
        """Start serving (again, on the same port after ``stop()``)."""
        self._port = self._http.start(self._host, self._port)
        return self

    def stop(self) -> None:
        """Simulate an outage: the listener and every open connection close; state stays."""
        self._http.stop()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._http.stop()
            self._cluster.close()

    def __enter__(self) -> FakeNomad:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def address(self) -> str:
        """``http://127.0.0.1:<port>`` — what ``NOMAD_ADDR`` would hold."""
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every queued evaluation is processed; re-raises a worker failure."""
        self._cluster.settle(timeout)

    def now(self) -> int:
        """The fake's clock, Unix nanoseconds: what its deadlines and timestamps read."""
        return self._cluster.store.now()

    def advance(self, seconds: float) -> None:
        """Move the fake's clock ``seconds`` ahead and fire what fell due meanwhile —
        ``check_restart`` restarts, progress deadlines of deployments, shutdown delays, and
        the clients' batched node updates (new dynamic metadata reaching the servers
        5–10 s after it was written) — and wait for the evaluations that follow."""
        if seconds < 0:
            raise ValueError("the fake's clock only moves forward")
        with self._cluster.store.cond:
            self._cluster.store.skipped_ns += round(seconds * 1e9)
        checkwatch.tick(self._cluster)
        deployments.expire(self._cluster)
        shutdown.fire(self._cluster)
        clientapi.reregister(self._cluster)
        self._cluster.settle()

    # -- what was asked, and faults to answer with -------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        with self._http.lock:
            return list(self._http.log)

    def clear_requests(self) -> None:
        with self._http.lock:
            self._http.log.clear()

    def inject(self, method: str, path_regex: str, status: int, body: Any = "", *,
               times: int | None = None, headers: dict[str, str] | None = None) -> Injection:
        """Answer requests whose method matches (``"*"`` for any) and whose path matches
        ``path_regex`` (``re.search``) with ``status`` and ``body`` — a str or bytes is
        sent as-is as text/plain, a dict or list as JSON — ``times`` times (default:
        until ``clear_injections``)."""
        re.compile(path_regex)
        inj = Injection(method=method.upper(), path_regex=path_regex, status=status, body=body,
                        times=times, headers=headers or {})
        with self._http.lock:
            self._http.injections.append(inj)
        return inj

    def clear_injections(self) -> None:
        with self._http.lock:
            self._http.injections.clear()

    # -- ACLs (``acl_token`` is a management token; ``acls=True`` enables them without one) --
    def _registry(self) -> acl.Registry:
        if self._acls is None:
            raise RuntimeError("ACLs are off in this FakeNomad; pass acl_token= or acls=True")
        return self._acls

    def apply_policy(self, name: str, rules: str, *, namespace: str = "", job: str = "",
                     group: str = "", task: str = "", description: str = "") -> None:
        """``nomad acl policy apply [-namespace … [-job … [-group … [-task …]]]] NAME FILE``;
        the rules are parsed as Nomad parses them (NomadError for what it refuses)."""
        policy = self._registry().apply(name, rules, namespace=namespace, job=job,
                                        group=group, task=task)
        policy.description = description

    def create_token(self, policies: Sequence[str], *, name: str = "",
                     management: bool = False) -> str:
        """``nomad acl token create [-name …] -policy …`` (``-type management`` with
        ``management``): the new token's secret, a UUID."""
        return self._registry().token(list(policies), name, management=management)

    def workload_token(self, alloc_id: str, task: str) -> str:
        """The workload identity a task of a running allocation calls Nomad with."""
        with self._cluster.store.cond:
            a = self._cluster.store.allocs[alloc_id]
            claim = acl.Claim(namespace=a.namespace, job=a.job_id, group=a.task_group,
                              task=task)
        return self._registry().identity(claim)

    def task_env(self, alloc_id: str, task: str) -> dict[str, str]:
        """The environment the task's ``env = true`` templates render for it, reading
        Variables with its workload identity; ``variables.TemplateBlockedError`` when the
        template cannot render (a variable it may not read, or one not there yet)."""
        with self._cluster.store.cond:
            a = self._cluster.store.allocs[alloc_id]
            claim = acl.Claim(namespace=a.namespace, job=a.job_id, group=a.task_group,
                              task=task)
            group = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
            spec = next(t for t in group["Tasks"] if t["Name"] == task)
        return variables.render_env(self._api, self._acls, claim, spec)

    def variable(self, path: str, namespace: str = "default") -> dict[str, str] | None:
        """The items of a Nomad Variable, or None."""
        with self._cluster.store.cond:
            v = self._api.variables.get((namespace, path))
            return dict(v.items) if v else None

    # -- reading the cluster ------------------------------------------------------------
    @property
    def unstarted(self) -> dict[str, str]:
        """Nodes whose client refused to start (a host volume path missing), by name."""
        return dict(self._cluster.unstarted)

    @property
    def nodes(self) -> list[Node]:
        with self._cluster.store.cond:
            return list(self._cluster.store.nodes.values())

    def node(self, name: str) -> Node:
        with self._cluster.store.cond:
            return self._cluster.store.node_by_name(name)

    def job(self, job_id: str, namespace: str = "default") -> dict[str, Any] | None:
        """The stored job (defaults filled, implied constraints added), or None."""
        with self._cluster.store.cond:
            rec = self._cluster.store.jobs.get((namespace, job_id))
            return dict(rec.spec) if rec else None

    def allocations(self, job_id: str, namespace: str = "default", *,
                    include_terminal: bool = False) -> list[Alloc]:
        """The job's allocations by name index; live ones only unless asked."""
        with self._cluster.store.cond:
            found = [a for a in self._cluster.store.job_allocs(namespace, job_id)
                     if include_terminal or not a.terminal]
        return sorted(found, key=lambda a: (a.index, a.create_index))

    def evaluations(self, job_id: str, namespace: str = "default") -> list[Eval]:
        with self._cluster.store.cond:
            return sorted(self._cluster.store.job_evals(namespace, job_id),
                          key=lambda e: e.create_index)

    def deployment(self, job_id: str, namespace: str = "default") -> Deployment | None:
        with self._cluster.store.cond:
            return self._cluster.store.latest_deployment(namespace, job_id)

    def services(self, name: str | None = None) -> list[ServiceReg]:
        with self._cluster.store.cond:
            return [s for s in self._cluster.store.services.values()
                    if name is None or s.service_name == name]

    # -- playing the clients -----------------------------------------------------------
    def run_alloc(self, alloc_id: str, *, through_prestart: bool = True) -> None:
        """Move a ``pending`` allocation to ``running`` (for ``auto_run=False``); with
        ``through_prestart=False`` its prestart tasks start and keep running, as a fetch
        does while it downloads, and no main task has started yet."""
        lifecycle.run_alloc(self._cluster, alloc_id, through_prestart=through_prestart)

    def finish_prestart(self, alloc_id: str) -> None:
        """The allocation's prestart tasks exit 0 and its main tasks start (``Poststart``
        registers their services)."""
        lifecycle.finish_prestart(self._cluster, alloc_id)

    def set_check(self, alloc_id: str, status: str, *, check: str | None = None,
                  output: str | None = None, status_code: int | None = None) -> None:
        """Set the allocation's check results (all, or the one named ``check``) to
        ``success``, ``failure`` or ``pending``; deployment health follows."""
        lifecycle.set_checks(self._cluster, alloc_id, status, check=check, output=output,
                             status_code=status_code)

    def set_job_checks(self, job_id: str, status: str, namespace: str = "default") -> None:
        """``set_check`` on every live allocation of the job."""
        lifecycle.set_job_checks(self._cluster, namespace, job_id, status)

    def fail_alloc(self, alloc_id: str, reason: str = "Exit Code: 1") -> None:
        """The allocation's tasks die: ``failed``, out of the catalog, rescheduled."""
        lifecycle.fail_alloc(self._cluster, alloc_id, reason)

    def set_alloc_memory(self, alloc_id: str, nbytes: int) -> None:
        """What ``/v1/client/allocation/:id/stats`` reports as RSS and Usage."""
        lifecycle.set_alloc_memory(self._cluster, alloc_id, nbytes)

    def set_node(self, name: str, *, status: str | None = None, eligible: bool | None = None,
                 drain: bool | None = None, meta: dict[str, str] | None = None) -> None:
        """Change a node (by name or ID): ``status="down"`` loses its allocations,
        ``drain=True`` migrates them, ``eligible=False`` only stops new placements;
        ``meta`` replaces its metadata (as a client restarted with new ``meta`` does),
        which changes what constraints on ``${meta.*}`` match."""
        lifecycle.set_node(self._cluster, name, status=status, eligible=eligible, drain=drain,
                           meta=meta)

    def node_meta(self, name: str) -> dict[str, str | None]:
        """The node's dynamic metadata on its client, as ``/v1/client/metadata`` wrote it
        (unsets of static keys as None), at once; ``node(name).meta`` is what the servers
        have, which lags by the client's re-register (``advance`` 10 s to land it)."""
        with self._cluster.store.cond:
            return dict(self._cluster.store.node_by_name(name).dynamic_meta)

    def apply_node_meta(self, name: str, meta: dict[str, str | None]) -> None:
        """``nomad node meta apply`` on the node (by name or ID): what an operator — or a
        hand edit gone stale — writes outside llmgw."""
        with self._cluster.store.cond:
            node = self._cluster.store.node_by_name(name)
            clientapi.validate_keys(meta)
            clientapi.apply(self._cluster, node, meta)

    def write_alloc_file(self, alloc_id: str, path: str, data: bytes | str) -> None:
        """A task writes ``path`` in its allocation's directory (``alloc/…`` is
        ``NOMAD_ALLOC_DIR``); ``/v1/client/fs/cat`` reads it."""
        with self._cluster.store.cond:
            a = self._cluster.store.allocs[alloc_id]
            a.files = {**a.files, path.lstrip("/"): data.encode() if isinstance(data, str)
                       else bytes(data)}

    def complete_alloc(self, alloc_id: str) -> None:
        """Every task of the allocation exits 0: a batch allocation is ``complete`` and
        stays so (its job does not place it again)."""
        lifecycle.complete_alloc(self._cluster, alloc_id)

    def set_node_rpc(self, name: str, *, delay: float = 0.0, error: str | None = None) -> None:
        """Trouble on the server's connection to a node's client: requests forwarded there
        (``/v1/allocation/:id/checks``, ``/v1/client/allocation/:id/stats``) wait ``delay``
        seconds, then answer 500 ``error`` when given — Nomad's text for a dead session is
        ``session open: session shutdown``. ``set_node_rpc(name)`` heals it."""
        lifecycle.set_node_rpc(self._cluster, name, delay=delay, error=error)

    def finish_deployment(self, job_id: str, status: str = "successful",
                          namespace: str = "default") -> None:
        """End the job's active deployment as ``successful`` or ``failed`` now."""
        lifecycle.finish_deployment(self._cluster, namespace, job_id, status)

    def add_node(self, node: Node) -> None:
        """Register one more client node; waiting evaluations are retried. A node whose
        host volume path is missing never starts (ValueError with the client's words)."""
        from llmgw.testing.fake_nomad.volumes import missing

        why = missing(node)
        if why is not None:
            raise ValueError(f"the client of {node.name} does not start: {why}")
        store = self._cluster.store
        with store.cond:
            idx = store.write("nodes")
            node.create_index = node.modify_index = idx
            store.nodes[node.id] = node
        self._cluster.unblock()
