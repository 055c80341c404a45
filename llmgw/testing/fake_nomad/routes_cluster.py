"""Allocations, evaluations, deployments, nodes, services, status and agent endpoints.

The allocation-check endpoints answer from the *client* (docs/nomad-api.md §4.4): a map keyed
by check ID, ``null`` for an allocation without checks, 404 ``Unknown allocation "id"``
for an unknown one and 404 ``No path to node`` when its node is down. The server
forwards them over its connection to the node (nomad/client_alloc_endpoint.go
``ClientAllocations.Checks`` → nomad/client_rpc.go ``NodeRpc``), and the agent turns
only "no path to node", "unknown allocation" and "unknown node" into 404
(command/agent/alloc_endpoint.go ``allocChecks``); anything else that connection
returns — a stream that times out or a session that shut down — is a **500** with the
error's text, and a wedged node makes the request wait. ``set_node_rpc`` plays that. Service reads
(§4.1) return every registration — healthy or not — and ``[]`` for an unknown name.
``filter=`` accepts the go-bexpr subset clients use for these lists:
``Field == "value"`` / ``!=`` clauses joined by ``and``.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from llmgw.testing.fake_nomad import wire
from llmgw.testing.fake_nomad.cluster import NomadError
from llmgw.testing.fake_nomad.fixtures import NOMAD_VERSION
from llmgw.testing.fake_nomad.records import Alloc, Eval, ServiceReg
from llmgw.testing.fake_nomad.scheduler import computed_class
from llmgw.testing.fake_nomad.server import Api, Request, Response, Route

Json = dict[str, Any]
_CLAUSE = re.compile(r'\s*([A-Za-z][\w.]*)\s*(==|!=)\s*"((?:[^"\\]|\\.)*)"\s*')


def _filter(expr: str) -> list[tuple[str, str, str]]:
    clauses = []
    for part in re.split(r"\s+and\s+", expr.strip()) if expr.strip() else []:
        m = _CLAUSE.fullmatch(part)
        if m is None:
            raise NomadError(400, f"failed to read filter expression: {expr!r} is not a "
                                  '`Field == "value"` clause the fake understands')
        clauses.append((m.group(1), m.group(2), m.group(3)))
    return clauses


def _matches(obj: Json, clauses: list[tuple[str, str, str]]) -> bool:
    for path, op, value in clauses:
        current: Any = obj
        for key in path.split("."):
            current = current.get(key) if isinstance(current, dict) else None
        if (str(current) == value) != (op == "=="):
            return False
    return True


def _in_ns(req: Request, namespace: str) -> bool:
    return req.namespace in ("*", namespace)


def list_allocations(api: Api, req: Request) -> Response:
    clauses = _filter(req.query.get("filter", ""))

    def body() -> list[Json]:
        out = []
        for a in sorted(api.store.allocs.values(), key=lambda a: a.create_index):
            if not (_in_ns(req, a.namespace) and a.id.startswith(req.query.get("prefix", ""))):
                continue
            stub = wire.alloc_stub(a, resources=req.flag("resources"),
                                   task_states=req.query.get("task_states", "true").lower()
                                   not in ("0", "f", "false"))
            if _matches(stub, clauses):
                out.append(stub)
        return out
    return api.blocking(req, lambda: api.store.read_index("allocs"), body)


def _alloc(api: Api, alloc_id: str, missing: str) -> Alloc:
    a = api.store.allocs.get(alloc_id)
    if a is None:
        raise NomadError(404, missing)
    return a


def get_alloc(api: Api, req: Request) -> Response:
    def index() -> int:
        a = api.store.allocs.get(req.params["id"])
        return a.modify_index if a else api.store.read_index("allocs")
    return api.blocking(req, index, lambda: wire.full_alloc(
        _alloc(api, req.params["id"], "alloc not found")))


def alloc_services(api: Api, req: Request) -> Response:
    def body() -> list[Json]:
        _alloc(api, req.params["id"], "alloc not found")
        return [wire.service(s) for s in api.store.services.values()
                if s.alloc_id == req.params["id"]]
    return api.blocking(req, lambda: api.store.read_index("service_registrations"), body)


def _client_alloc(api: Api, alloc_id: str) -> Alloc:
    """ClientAllocations.*: the server forwards to the node running the allocation.

    The caller holds the store's lock; waiting on a slow node releases it.
    """
    a = _alloc(api, alloc_id, f'Unknown allocation "{alloc_id}"')
    node = api.store.nodes[a.node_id]
    if node.status == "down":
        raise NomadError(404, "No path to node")
    if node.rpc_delay > 0:
        deadline = time.monotonic() + node.rpc_delay
        delay, error = node.rpc_delay, node.rpc_error
        while api.running and (node.rpc_delay, node.rpc_error) == (delay, error):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            api.store.cond.wait(remaining)
    if node.rpc_error:
        raise NomadError(500, node.rpc_error)
    return a


def alloc_checks(api: Api, req: Request) -> Response:
    with api.store.cond:
        a = _client_alloc(api, req.params["id"])
        results = api.store.checks.get(a.id) or {}
        return Response(body={cid: wire.check(c) for cid, c in results.items()} or None)


def alloc_stats(api: Api, req: Request) -> Response:
    with api.store.cond:
        a = _client_alloc(api, req.params["id"])
        return Response(body=wire.alloc_stats(a, time.time_ns()))


def not_found(api: Api, req: Request) -> Response:
    return Response(404, text="resource not found")


def _eval(api: Api, eval_id: str) -> Eval:
    e = api.store.evals.get(eval_id)
    if e is None:
        raise NomadError(404, "eval not found")
    return e


def _related(api: Api, e: Eval) -> list[Json]:
    seen, todo, out = {e.id}, [e.next_eval, e.previous_eval, e.blocked_eval], []
    while todo:
        other = api.store.evals.get(todo.pop())
        if other is None or other.id in seen:
            continue
        seen.add(other.id)
        todo += [other.next_eval, other.previous_eval, other.blocked_eval]
        stub = wire.evaluation(other)
        out.append({k: stub.get(k, "" if k not in ("CreateIndex", "ModifyIndex", "CreateTime",
                                                        "ModifyTime") else 0) for k in (
            "ID", "Namespace", "Priority", "Type", "TriggeredBy", "JobID", "NodeID",
            "DeploymentID", "Status", "StatusDescription", "NextEval", "PreviousEval",
            "BlockedEval", "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime")})
    return out


def get_eval(api: Api, req: Request) -> Response:
    def index() -> int:
        e = api.store.evals.get(req.params["id"])
        return e.modify_index if e else api.store.read_index("evals")

    def body() -> Json:
        e = _eval(api, req.params["id"])
        out = wire.evaluation(e)
        if req.flag("related"):
            out["RelatedEvals"] = _related(api, e)
        return out
    return api.blocking(req, index, body)


def eval_allocations(api: Api, req: Request) -> Response:
    def body() -> list[Json]:
        _eval(api, req.params["id"])
        return [wire.alloc_stub(a) for a in api.store.allocs.values()
                if a.eval_id == req.params["id"]]
    return api.blocking(req, lambda: api.store.read_index("allocs"), body)


def list_evals(api: Api, req: Request) -> Response:
    clauses = _filter(req.query.get("filter", ""))
    return api.blocking(req, lambda: api.store.read_index("evals"), lambda: [
        ev for ev in (wire.evaluation(e) for e in sorted(api.store.evals.values(),
                                                          key=lambda e: e.create_index)
                      if _in_ns(req, e.namespace) and e.id.startswith(req.query.get("prefix", "")))
        if _matches(ev, clauses)])


def list_deployments(api: Api, req: Request) -> Response:
    """Deployment.List (nomad/deployment_endpoint.go): the namespace's deployments (``*``
    for all) oldest first by CreateIndex, or those whose ID starts with ``prefix``."""
    return api.blocking(req, lambda: api.store.read_index("deployment"), lambda: [
        wire.deployment(d) for d in sorted(api.store.deployments.values(),
                                           key=lambda d: (d.create_index, d.id))
        if _in_ns(req, d.namespace) and d.id.startswith(req.query.get("prefix", ""))])


def get_deployment(api: Api, req: Request) -> Response:
    def body() -> Json:
        d = api.store.deployments.get(req.params["id"])
        if d is None:
            raise NomadError(404, "deployment not found")
        return wire.deployment(d)
    return api.blocking(req, lambda: api.store.read_index("deployment"), body)


def list_nodes(api: Api, req: Request) -> Response:
    return api.blocking(req, lambda: api.store.read_index("nodes"), lambda: [
        wire.node_stub(n, resources=req.flag("resources"), os=req.flag("os"))
        for n in sorted(api.store.nodes.values(), key=lambda n: n.id)
        if n.id.startswith(req.query.get("prefix", ""))])


def get_node(api: Api, req: Request) -> Response:
    def body() -> Json:
        n = api.store.nodes.get(req.params["id"])
        if n is None:
            raise NomadError(404, "node not found")
        return wire.node(n, computed_class(n))
    return api.blocking(req, lambda: api.store.read_index("nodes"), body)


def node_allocations(api: Api, req: Request) -> Response:
    return api.blocking(req, lambda: api.store.read_index("allocs"), lambda: [
        wire.full_alloc(a) for a in sorted(api.store.allocs.values(), key=lambda a: a.create_index)
        if a.node_id == req.params["id"]])


def list_services(api: Api, req: Request) -> Response:
    def body() -> list[Json]:
        by_ns: dict[str, dict[str, set[str]]] = {}
        for s in api.store.services.values():
            if _in_ns(req, s.namespace):
                by_ns.setdefault(s.namespace, {}).setdefault(s.service_name, set()).update(s.tags)
        return [{"Namespace": ns, "Services": [{"ServiceName": name, "Tags": sorted(tags)}
                                              for name, tags in sorted(names.items())]}
                for ns, names in sorted(by_ns.items())]
    return api.blocking(req, lambda: api.store.read_index("service_registrations"), body)


def _choose(regs: list[ServiceReg], choose: str) -> list[ServiceReg]:
    """Rendezvous hashing over the registrations (§4.2); not health-aware, as in Nomad."""
    count, sep, key = choose.partition("|")
    if not sep or not count.isdigit() or not key:
        raise NomadError(400, "failed to choose services: Parameter for choose must be in "
                              "form '<number>|<key>'")

    def rank(s: ServiceReg) -> str:
        h = hashlib.sha256(s.port.to_bytes(8, "big"))
        for part in [s.alloc_id, s.id, s.namespace, s.address, s.service_name, *s.tags, key]:
            h.update(part.encode())
        return h.hexdigest()
    return sorted(regs, key=rank)[: int(count)]


def get_service(api: Api, req: Request) -> Response:
    name = req.params["name"]
    if not name:
        raise NomadError(400, "missing service name")

    def body() -> list[Json]:
        regs = sorted((s for s in api.store.services.values()
                       if s.service_name == name and _in_ns(req, s.namespace)),
                      key=lambda s: s.create_index)
        if req.query.get("choose"):
            regs = _choose(regs, req.query["choose"])
        return [wire.service(s) for s in regs]
    return api.blocking(req, lambda: api.store.read_index("service_registrations"), body)


def leader(api: Api, req: Request) -> Response:
    return Response(body="127.0.0.1:4647")


def peers(api: Api, req: Request) -> Response:
    return Response(body=["127.0.0.1:4647"])


def regions(api: Api, req: Request) -> Response:
    return Response(body=[api.region])


def agent_self(api: Api, req: Request) -> Response:
    version = {"Version": NOMAD_VERSION, "Revision": "4e09b5b3ea2b", "VersionPrerelease": "",
               "VersionMetadata": "", "BuildDate": "2025-09-09T00:00:00Z"}
    return Response(body={
        "config": {"Region": api.region, "Datacenter": "dc1", "NodeName": "fake-nomad",
                   "Version": version, "ACL": {"Enabled": api.acls is not None},
                   "Server": {"Enabled": True}, "Client": {"Enabled": False}},
        "member": {"Name": f"fake-nomad.{api.region}", "Addr": "127.0.0.1", "Port": 4648,
                   "Status": "alive", "Tags": {"region": api.region, "dc": "dc1",
                                               "role": "nomad", "build": NOMAD_VERSION}},
        "stats": {"nomad": {"leader": "true", "server": "true"}},
    })


_ALLOC = r"/v1/allocation/(?P<id>[^/]+)"
_CLIENT = r"/v1/client/allocation/(?P<id>[^/]+)"
ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(r"/v1/allocations"), {"GET": list_allocations}),
    (re.compile(_ALLOC), {"GET": get_alloc}),
    (re.compile(_ALLOC + "/checks"), {"GET": alloc_checks}),
    (re.compile(_ALLOC + "/services"), {"GET": alloc_services}),
    (re.compile(_ALLOC + "/.*"), dict.fromkeys(("GET", "PUT", "POST", "DELETE"), not_found)),
    (re.compile(_CLIENT + "/checks"), {"GET": alloc_checks}),
    (re.compile(_CLIENT + "/stats"), {"GET": alloc_stats}),
    (re.compile(r"/v1/client/allocation/.*"),
     dict.fromkeys(("GET", "PUT", "POST", "DELETE"), not_found)),
    (re.compile(r"/v1/evaluations"), {"GET": list_evals}),
    (re.compile(r"/v1/evaluation/(?P<id>[^/]+)"), {"GET": get_eval}),
    (re.compile(r"/v1/evaluation/(?P<id>[^/]+)/allocations"), {"GET": eval_allocations}),
    (re.compile(r"/v1/deployments"), {"GET": list_deployments}),
    (re.compile(r"/v1/deployment/(?P<id>[^/]+)"), {"GET": get_deployment}),
    (re.compile(r"/v1/nodes"), {"GET": list_nodes}),
    (re.compile(r"/v1/node/(?P<id>[^/]+)"), {"GET": get_node}),
    (re.compile(r"/v1/node/(?P<id>[^/]+)/allocations"), {"GET": node_allocations}),
    (re.compile(r"/v1/services"), {"GET": list_services}),
    (re.compile(r"/v1/service/(?P<name>[^/]*)"), {"GET": get_service}),
    (re.compile(r"/v1/status/leader"), {"GET": leader}),
    (re.compile(r"/v1/status/peers"), {"GET": peers}),
    (re.compile(r"/v1/regions"), {"GET": regions}),
    (re.compile(r"/v1/agent/self"), {"GET": agent_self}),
]
