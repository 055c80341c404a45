"""Nomad's HTTP API, through python-nomad, in typed calls with llmgw's errors.

python-nomad supplies the connection: address, ACL token (``X-Nomad-Token``),
namespace and region parameters, TLS (CA via ``verify=path``, a client
certificate via ``cert``) and its exception classes. Every call here goes
through its endpoint objects' public ``request()`` rather than the
convenience methods, for two reasons: the convenience methods return
``.json()`` and so lose ``X-Nomad-Index``, which blocking queries need; and
half of what llmgw calls has no method at all (services, allocation checks,
job scale — docs/nomad-api.md §6). One path for all calls means one place that
decodes into typed structs and one place that turns failures into errors.

Two python-nomad defaults are overridden on purpose: TLS verification is on
(python-nomad turns it off unless told), and the namespace is passed
explicitly on the endpoints python-nomad does not append it to (services,
evaluations, validate).

Every failure becomes an llmgw error that names the Nomad address, the
request, what Nomad said, and what to check:

* a 403 → ``BackendPermissionError``: Nomad answered and its ACL refuses llmgw's
  token the call; the error names what the call needs (``access.needed_for``), which
  token it was (its name and accessor, read once from ``/v1/acl/token/self``) and
  where to grant it. It is no outage: nothing is retried with back-off;
* unreachable, timed out, 5xx trouble, or an answer that is not Nomad's JSON →
  ``BackendUnavailableError``;
  on the endpoints the servers forward to the allocation's node (checks,
  stats), a 5xx other than the cluster's own trouble, or no answer within the
  timeout, is that **node's** trouble → ``NodeUnreachableError`` (a subclass):
  the agent answers everything else, so one wedged node must not read as
  "Nomad is down";
* 404 → ``NotFoundError``; ``/scale`` refused during a deployment →
  ``ScaleBlockedError``; a job Nomad refuses to register → ``NomadRejectedError``.

All methods block; the backend calls them on its own threads.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar, cast

import msgspec
import nomad.api.exceptions as nomad_errors  # python-nomad
import requests
from nomad.api.base import Requester

from llmgw.config import NomadConfig
from llmgw.errors import (
    BackendPermissionError,
    BackendUnavailableError,
    LlmgwError,
    NotFoundError,
    RefusedError,
)
from llmgw.scheduler.nomad import access, credentials, wire
from llmgw.scheduler.nomad import jobspec as js

T = TypeVar("T")
_JSON = {"Content-Type": "application/json"}


class ScaleBlockedError(RefusedError):
    """``/scale`` refused because a deployment is running (§5.3)."""

    kind = "scale_blocked"


class NodeUnreachableError(BackendUnavailableError):
    """The servers could not get an answer from the allocation's node (a 500 on the
    forwarded request, or none within the timeout): that node's trouble, not Nomad's."""

    kind = "node_unreachable"


# 500s that are the cluster's trouble whichever node a request is about (§7).
_CLUSTER_TROUBLE = ("No cluster leader", "No path to region")


class JobChangedError(RefusedError):
    """A check-and-set register found the job changed since it was read (§1.1)."""

    kind = "job_changed"


class NomadRejectedError(LlmgwError):
    """Nomad refused a job llmgw rendered; the text is Nomad's."""

    kind = "nomad_rejected"


class _VariableConflictError(LlmgwError):
    """A check-and-set write of a Variable lost to another write."""


def method_path(where: str) -> tuple[str, str]:
    """``("POST", "jobs")`` from ``"POST /v1/jobs"``."""
    method, _, path = where.partition(" ")
    return method, path.removeprefix("/v1/")


def _short(exc: object) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "…"


class NomadClient:
    """Typed, blocking calls to one Nomad cluster."""

    def __init__(self, cfg: NomadConfig, *, session: requests.Session | None = None) -> None:
        self.cfg = cfg
        self.address = cfg.address.rstrip("/")
        verify: bool | str = cfg.ca_cert or not cfg.tls_skip_verify
        cert = (cfg.client_cert, cfg.client_key) if cfg.client_cert and cfg.client_key else ()
        # The settings python-nomad's ``Nomad`` object would hand each endpoint,
        # built here rather than through it: its constructor falls back to
        # NOMAD_* variables on its own, and llmgw has already applied those
        # (and only those the configuration allows) in load_config.
        self._session = session or requests.Session()
        self._settings: dict[str, Any] = {
            "address": self.address, "token": cfg.token or None,
            "namespace": cfg.namespace or None, "region": cfg.region or None,
            "timeout": cfg.timeout, "verify": verify, "cert": cert, "session": self._session,
        }
        self._endpoints: dict[str, Requester] = {}
        self._node_cache: dict[str, wire.Node] = {}
        self._node_lock = threading.Lock()
        self._whoami: str | None = None    # the token as /v1/acl/token/self named it

    def close(self) -> None:
        self._session.close()

    # ---- transport ----------------------------------------------------------

    def _endpoint(self, root: str) -> Requester:
        ep = self._endpoints.get(root)
        if ep is None:
            ep = Requester(**self._settings)
            ep.ENDPOINT = root
            self._endpoints[root] = ep
        return ep

    def _send(self, method: str, root: str, *path: str, params: dict[str, Any] | None = None,
              body: bytes | None = None, timeout: float | None = None,
              job_write: bool = False, forwarded: bool = False) -> requests.Response:
        """``forwarded``: the servers pass this request on to an allocation's node."""
        where = f"{method.upper()} /v1/{'/'.join((root, *path))}"
        try:
            return self._endpoint(root).request(  # type: ignore[no-any-return]
                *path, method=method, params=dict(params or {}), data=body,
                headers=dict(_JSON) if body is not None else None,
                timeout=timeout if timeout is not None else self.cfg.timeout,
            )
        except nomad_errors.BaseNomadException as exc:
            raise self._error(exc, where, job_write, forwarded) from None
        except requests.RequestException as exc:  # raised outside python-nomad's own net
            if forwarded and isinstance(exc, requests.ReadTimeout):
                raise self._node_unreachable(where, exc) from None
            raise self._unreachable(where, exc) from None

    def _node_unreachable(self, where: str, reason: object) -> NodeUnreachableError:
        return NodeUnreachableError(
            f"Nomad at {self.address} got no answer for {where} from the allocation's node "
            f"({_short(reason)}); the node may be overloaded or cut off from the servers — "
            "check it with `nomad node status`")

    def _unreachable(self, where: str, reason: object) -> BackendUnavailableError:
        check = ("check scheduler.nomad.address (or NOMAD_ADDR) and that the Nomad agent is "
                 "running")
        if self.address.startswith("https://"):
            check += (", and the TLS settings: ca_cert (NOMAD_CACERT) is the CA that signed "
                      "the servers' certificate, which must name the address's host")
            # Under TLS 1.3 a server that wants a certificate refuses after the handshake,
            # so what the client sees is a reset or an alert, not a certificate error:
            # say what llmgw sent rather than guess from the exception.
            if self.cfg.client_cert and self.cfg.client_key:
                check += (f"; llmgw presents {self.cfg.client_cert}, which must be signed by "
                          "the CA of the servers' ca_file")
            else:
                check += ("; llmgw presents no client certificate, and servers with "
                          "verify_https_client = true refuse every caller without one: set "
                          "client_cert and client_key (NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY)")
        return BackendUnavailableError(
            f"cannot reach Nomad at {self.address} ({where}): {_short(reason)}; {check}")

    def _error(self, exc: nomad_errors.BaseNomadException, where: str,
               job_write: bool, forwarded: bool = False) -> LlmgwError:
        resp = exc.nomad_resp
        if not isinstance(resp, requests.Response):
            if forwarded and isinstance(resp, requests.ReadTimeout):
                return self._node_unreachable(where, resp)
            return self._unreachable(where, resp)
        status, text = resp.status_code, (resp.text or "").strip() or resp.reason
        said = f"Nomad at {self.address} answered {where} with {status}: {_short(text)}"
        if status in (401, 403):
            return self._refused(method_path(where), said, text)
        if status == 404:
            return NotFoundError(said)
        if status == 409 and where.startswith("PUT /v1/var/"):
            return _VariableConflictError(said)
        if status == 400 and "scaling blocked due to active deployment" in text:
            return ScaleBlockedError(said)
        if status >= 500 and forwarded and not any(t in text for t in _CLUSTER_TROUBLE):
            return self._node_unreachable(where, f"{status}: {text}")
        if status >= 500 and job_write and "Enforcing job modify index" in text:
            return JobChangedError(said)
        if status >= 500 and job_write and "No cluster leader" not in text:
            # An invalid job is a 500 carrying the validation errors (§7).
            return NomadRejectedError(
                f"{said}; the job llmgw rendered was refused (see `llmgw jobspec render`)")
        if status >= 500:
            return BackendUnavailableError(f"{said}; check the Nomad servers' health and logs")
        return LlmgwError(f"{said}; llmgw sent a request Nomad does not accept")

    def _token_name(self) -> str:
        """Which token was refused: its name and accessor when Nomad says (read once)."""
        if not self.cfg.token:
            return "no token (Nomad's anonymous policy; set scheduler.nomad.token or NOMAD_TOKEN)"
        if self._whoami is None:
            self._whoami = ""
            try:
                me = self.token_self()
            except LlmgwError:
                me = None
            if me is not None:
                self._whoami = f" {me.Name!r} (accessor {me.AccessorID})"
        return f"the token{self._whoami} in scheduler.nomad.token (or NOMAD_TOKEN)"

    def _refused(self, call: tuple[str, str], said: str, text: str) -> BackendPermissionError:
        if "ACL token not found" in text:
            return BackendPermissionError(
                f"{said}; Nomad does not know the token in scheduler.nomad.token (or "
                "NOMAD_TOKEN): it was deleted or expired, or belongs to another cluster; "
                "create one with `nomad acl token create -name llmgw -policy llmgw`",
                needs=("a token Nomad knows",))
        needs = access.needed_for(*call, self.cfg.namespace, self.cfg.cache_volume)
        what = " and ".join(g.text for g in needs) or "a capability Nomad did not name"
        return BackendPermissionError(
            f"{said}: {self._token_name()} lacks what this call needs: {what}; grant it in "
            "the token's policy (nomad/llmgw-policy.hcl has every grant llmgw needs) and "
            "run `llmgw nomad doctor` to see what else is missing",
            needs=tuple(g.text for g in needs))

    def _decode(self, resp: requests.Response, type_: type[T], where: str) -> T:
        return cast(T, self._decode_any(resp, type_, where))

    def _decode_any(self, resp: requests.Response, type_: object, where: str) -> object:
        """For types mypy cannot spell as ``type[T]`` (``X | None``): cast at the caller."""
        try:
            return msgspec.json.decode(resp.content, type=type_)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BackendUnavailableError(
                f"Nomad at {self.address} answered {where} with something that is not Nomad's "
                f"JSON ({_short(exc)}); check that scheduler.nomad.address is a Nomad agent's "
                "HTTP address"
            ) from None

    def _get(self, type_: type[T], root: str, *path: str,
             params: dict[str, Any] | None = None, timeout: float | None = None) -> T:
        resp = self._send("get", root, *path, params=params, timeout=timeout)
        return self._decode(resp, type_, f"GET /v1/{'/'.join((root, *path))}")

    @property
    def _ns(self) -> dict[str, Any]:
        return {"namespace": self.cfg.namespace} if self.cfg.namespace else {}

    # ---- jobs ---------------------------------------------------------------

    def validate(self, job: js.Job) -> list[str]:
        """Nomad's validation errors for ``job`` (empty when valid). Always a 200 (§1.1)."""
        resp = self._send("post", "validate", "job", params=self._ns,
                          body=js.encode(js.JobValidateRequest(Job=job)), job_write=True)
        v = self._decode(resp, wire.ValidateResponse, "POST /v1/validate/job")
        errors = list(v.ValidationErrors or [])
        if not errors and v.Error:
            errors.append(v.Error)
        return errors

    def plan(self, job: js.Job) -> wire.PlanResponse:
        resp = self._send("post", "job", job.ID, "plan", params=self._ns,
                          body=js.encode(js.JobPlanRequest(Job=job, Diff=False)), job_write=True)
        return self._decode(resp, wire.PlanResponse, f"POST /v1/job/{job.ID}/plan")

    def register(self, job: js.Job, *, if_index: int | None = None) -> wire.RegisterResponse:
        """Register ``job``; with ``if_index``, only if the job's JobModifyIndex still is
        that (JobChangedError otherwise)."""
        body = (js.JobRegisterRequest(Job=job) if if_index is None else
                js.JobRegisterRequest(Job=job, EnforceIndex=True, JobModifyIndex=if_index))
        resp = self._send("post", "jobs", params=self._ns, body=js.encode(body), job_write=True)
        return self._decode(resp, wire.RegisterResponse, "POST /v1/jobs")

    def deregister(self, job_id: str) -> None:
        """Stop the job (not purged, so its history stays readable until Nomad's GC)."""
        self._send("delete", "job", job_id, params=self._ns)

    def jobs(self, prefix: str) -> list[wire.JobListStub]:
        return self._get(list[wire.JobListStub], "jobs",
                         params={**self._ns, "prefix": prefix, "meta": "true"})

    def scale_status(self, job_id: str) -> wire.JobScaleStatus:
        return self._get(wire.JobScaleStatus, "job", job_id, "scale", params=self._ns)

    def scale(self, job_id: str, group: str, count: int, message: str) -> wire.RegisterResponse:
        body = js.encode(js.ScalingRequest(Count=count, Target={"Group": group}, Message=message))
        resp = self._send("post", "job", job_id, "scale", params=self._ns, body=body)
        return self._decode(resp, wire.RegisterResponse, f"POST /v1/job/{job_id}/scale")

    def job_allocations(self, job_id: str) -> list[wire.Allocation]:
        return self._get(list[wire.Allocation], "job", job_id, "allocations", params=self._ns)

    def job_version(self, job_id: str) -> wire.JobVersion:
        return self._get(wire.JobVersion, "job", job_id, params=self._ns)

    def deployments(self) -> list[wire.Deployment]:
        """Every deployment in the namespace, oldest first (one call for all jobs)."""
        return self._get(list[wire.Deployment], "deployments", params=self._ns)

    def job_evaluations(self, job_id: str) -> list[wire.Evaluation]:
        return self._get(list[wire.Evaluation], "job", job_id, "evaluations", params=self._ns)

    # ---- allocations --------------------------------------------------------

    def allocation(self, alloc_id: str) -> wire.Allocation:
        return self._get(wire.Allocation, "allocation", alloc_id, params=self._ns)

    def alloc_checks(self, alloc_id: str,
                     timeout: float | None = None) -> dict[str, wire.CheckStatus]:
        """The latest result of each check of the allocation; empty when it has none yet."""
        where = f"GET /v1/allocation/{alloc_id}/checks"
        resp = self._send("get", "allocation", alloc_id, "checks", params=self._ns,
                          timeout=timeout, forwarded=True)
        got = self._decode_any(resp, dict[str, wire.CheckStatus] | None, where)
        return cast("dict[str, wire.CheckStatus] | None", got) or {}

    def alloc_stats(self, alloc_id: str) -> wire.AllocStats:
        where = f"GET /v1/client/allocation/{alloc_id}/stats"
        resp = self._send("get", "client/allocation", alloc_id, "stats", params=self._ns,
                          forwarded=True)
        return self._decode(resp, wire.AllocStats, where)

    def all_allocations(self) -> list[wire.Allocation]:
        """Every allocation in every namespace, with resources: what capacity is spent on."""
        return self._get(list[wire.Allocation], "allocations",
                         params={"namespace": "*", "resources": "true", "task_states": "false"})

    # ---- nodes --------------------------------------------------------------

    def nodes(self) -> list[wire.Node]:
        """Every node with its resources and meta.

        The list endpoint has resources but no meta (where the fabric is), so
        each node is read once and again only when its ModifyIndex moves.
        """
        stubs = self._get(list[wire.Node], "nodes", params={"resources": "true"})
        out = []
        for stub in stubs:
            with self._node_lock:
                cached = self._node_cache.get(stub.ID)
            if cached is None or cached.ModifyIndex != stub.ModifyIndex:
                try:
                    cached = self._get(wire.Node, "node", stub.ID)
                except NotFoundError:
                    continue  # removed between the list and the read
                with self._node_lock:
                    self._node_cache[stub.ID] = cached
            out.append(cached)
        live = {s.ID for s in stubs}
        with self._node_lock:
            for gone in set(self._node_cache) - live:
                del self._node_cache[gone]
        return out

    def apply_node_meta(self, node_id: str, meta: dict[str, str | None]) -> wire.NodeMetaResponse:
        """Set (or, with None, unset) dynamic metadata on a node (Nomad ≥ 1.5; node:write)."""
        body = msgspec.json.encode({"NodeID": node_id, "Meta": meta})
        resp = self._send("post", "client/metadata", params={"node_id": node_id}, body=body,
                          forwarded=True)
        return self._decode(resp, wire.NodeMetaResponse, "POST /v1/client/metadata")

    def holding_allocations(self) -> list[wire.Allocation]:
        """Every allocation of llmgw's namespace, with resources and task states."""
        return self._get(list[wire.Allocation], "allocations",
                         params={**self._ns, "resources": "true"})

    def namespace_allocations(self) -> list[wire.Allocation]:
        """Every allocation of llmgw's namespace, with task states."""
        return self._get(list[wire.Allocation], "allocations", params=self._ns)

    def alloc_file(self, alloc_id: str, path: str, timeout: float | None = None) -> bytes | None:
        """A file of the allocation's directory on its node (read-fs); None when it is not
        there (yet)."""
        try:
            resp = self._send("get", "client/fs/cat", alloc_id, params={**self._ns, "path": path},
                              timeout=timeout, forwarded=True)
        except NotFoundError:
            return None
        return bytes(resp.content)

    def task_log(self, alloc_id: str, task: str, kind: str, tail: int,
                 timeout: float | None = None) -> bytes:
        """The last ``tail`` bytes a task wrote to ``kind`` (stdout or stderr), read-fs or
        read-logs (command/agent/fs_endpoint.go ``Logs``: ``origin=end``, ``offset``
        counted back from the end, ``plain=true`` for the bytes themselves)."""
        resp = self._send("get", "client/fs/logs", alloc_id, params={
            **self._ns, "task": task, "type": kind, "origin": "end", "offset": tail,
            "plain": "true", "follow": "false"}, timeout=timeout, forwarded=True)
        return bytes(resp.content)

    # ---- variables ----------------------------------------------------------

    def read_variable(self, path: str) -> credentials.Variable | None:
        """The Variable at ``path`` in llmgw's namespace; None when there is none (404
        ``variable not found``, command/agent/variable_endpoint.go ``variableQuery``)."""
        try:
            return self._get(credentials.Variable, "var", *path.split("/"), params=self._ns)
        except NotFoundError:
            return None

    def write_variable(self, path: str, items: dict[str, str], cas: int) -> bool:
        """Set the Variable only if its ModifyIndex is still ``cas`` (0: only if absent);
        False when another write won (409)."""
        body = msgspec.json.encode({"Items": items})
        try:
            self._send("put", "var", *path.split("/"), params={**self._ns, "cas": cas},
                       body=body)
        except _VariableConflictError:
            return False
        return True

    # ---- ACL ----------------------------------------------------------------

    def token_self(self) -> wire.AclToken:
        """The token llmgw calls with (``GET /v1/acl/token/self``); with ACLs off Nomad
        answers its ``acls-disabled`` token (nomad/acl_endpoint.go ``WhoAmI``)."""
        return self._get(wire.AclToken, "acl", "token", "self")

    def acl_policy(self, name: str) -> wire.AclPolicy:
        """A policy the token carries, with ``RulesJSON``: the server's own parse."""
        return self._get(wire.AclPolicy, "acl", "policy", name)

    def leader(self) -> str:
        """``GET /v1/status/leader``: answered without a token, so it tells reachability."""
        return self._get(str, "status", "leader")

    # ---- services -----------------------------------------------------------

    def services(self, index: int, wait: float) -> tuple[list[wire.NamespacedServices], int]:
        """Blocking query on the service list: returns when any registration may have changed."""
        params: dict[str, Any] = {**self._ns, "index": index, "wait": f"{int(wait)}s"}
        # The server adds up to wait/16 of jitter (§4.3).
        resp = self._send("get", "services", params=params,
                          timeout=wait + wait / 16 + self.cfg.timeout)
        got = cast("list[wire.NamespacedServices] | None", self._decode_any(
            resp, list[wire.NamespacedServices] | None, "GET /v1/services"))
        try:
            new_index = int(resp.headers.get("X-Nomad-Index", "0"))
        except ValueError:
            new_index = 0
        return got or [], new_index

    def service(self, name: str) -> list[wire.ServiceRegistration]:
        """Every registration of ``name``, healthy or not (§4.4: Nomad does not filter)."""
        resp = self._send("get", "service", name, params=self._ns)
        got = self._decode_any(resp, list[wire.ServiceRegistration] | None,
                               f"GET /v1/service/{name}")
        return cast("list[wire.ServiceRegistration] | None", got) or []
