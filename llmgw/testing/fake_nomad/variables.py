"""Nomad Variables: ``/v1/var/:path``, ``/v1/vars``, and what a task's template reads.

The HTTP face follows command/agent/variable_endpoint.go: ``GET /v1/var/:path`` answers
the variable or ``404 variable not found`` (``variableQuery``); ``PUT``/``POST`` takes
``{"Items": {...}}`` — none is ``400 variable missing required Items object``
(``variableUpsert``) — with ``?cas=<ModifyIndex>`` for check-and-set (``cas=0``: only if
absent), a lost race answering ``409`` with the variable that won, its items only for a
caller that may read it (nomad/variables_endpoint.go ``makeVariablesApplyResponse``);
``DELETE`` answers ``204``. A path must match ``^[a-zA-Z0-9-_~/]{1,128}$`` (no dots) and,
under ``nomad/``, lie below ``nomad/jobs``, ``nomad/sentinel`` or
``nomad/job-templates/<x>`` (nomad/structs/variables.go ``validVariablePath``,
``ValidatePath``); items are at most 64 KiB in all (``VariableDecrypted.Validate``).
Either refusal is a **400**: nomad/variables_endpoint.go ``Apply`` wraps what
``canonicalizeAndValidate`` returns in ``NewErrRPCCoded(http.StatusBadRequest, …)`` —
after the permission check, so a token that may not write the path hears 403 first.
Who may read or write which path is ``acl``'s.

A task reads variables through its templates, with its workload identity
(nomad/variables_endpoint.go ``authorize``: a workload sees its own ``nomad/jobs/<job>``
paths, plus what policies attached to it grant). ``render_env`` plays that client side
for the one form llmgw writes — ``{{ with nomadVar "PATH" }}…{{ .KEY }}…{{ end }}`` in a
template with ``Envvars: true``, whose rendered ``KEY=value`` lines become the task's
environment (client/allocrunner/taskrunner/template/template.go ``loadTemplateEnv``).
A variable the workload may not read fails the template; one that does not exist yet
keeps the task waiting, as consul-template does for a missing dependency.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from llmgw.testing.fake_nomad.acl import Acl, Claim, Registry
from llmgw.testing.fake_nomad.cluster import NomadError
from llmgw.testing.fake_nomad.server import Api, Request, Response, Route, meta

Json = dict[str, Any]
_PATH = re.compile(r"^[a-zA-Z0-9-_~/]{1,128}$")
_MAX_SIZE = 65536
_WITH = re.compile(r'\{\{-?\s*with\s+nomadVar\s+"([^"]+)"\s*-?\}\}(.*?)\{\{-?\s*end\s*-?\}\}',
                   re.S)
_KEY = re.compile(r"\{\{-?\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*-?\}\}")


@dataclass
class Variable:
    namespace: str
    path: str
    items: dict[str, str]
    create_index: int
    modify_index: int
    create_time: int
    modify_time: int

    def wire(self, items: bool = True) -> Json:
        return {"Namespace": self.namespace, "Path": self.path,
                "CreateIndex": self.create_index, "CreateTime": self.create_time,
                "ModifyIndex": self.modify_index, "ModifyTime": self.modify_time,
                **({"Items": dict(self.items)} if items else {})}


def validate_path(path: str) -> None:
    """nomad/structs/variables.go ``ValidatePath``; NomadError(400), as ``Apply`` codes it."""
    if not _PATH.match(path):
        raise NomadError(400, f'invalid path "{path}"')
    parts = path.split("/")
    if parts[0] != "nomad":
        return
    if len(parts) == 1:
        raise NomadError(400, '"nomad" is a reserved top-level directory path, but you may '
                              'write variables to "nomad/jobs", "nomad/job-templates", '
                              '"nomad/sentinel", or below')
    if parts[1] in ("jobs", "sentinel") or (parts[1] == "job-templates" and len(parts) == 3):
        return
    raise NomadError(400, 'only paths at "nomad/jobs" or "nomad/job-templates" and below are '
                          'valid paths under the top-level "nomad" directory')


def _vars(api: Api) -> dict[tuple[str, str], Variable]:
    return api.variables


def _namespace(req: Request) -> str:
    ns = req.query.get("namespace") or "default"
    if ns == "*":
        raise NomadError(500, 'can not target wildcard ("*")namespace')
    return ns


def read_var(api: Api, req: Request) -> Response:
    path = req.params["path"]
    with api.store.cond:
        v = _vars(api).get((_namespace(req), path))
        if v is None:
            raise NomadError(404, "variable not found")
        return Response(body=v.wire(), headers=meta(v.modify_index))


def _cas(req: Request) -> int | None:
    raw = req.query.get("cas")
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise NomadError(400, f'can not parse cas: strconv.ParseUint: parsing "{raw}": '
                              "invalid syntax")
    return int(raw)


def _conflict(req: Request, current: Variable | None, ns: str) -> Response:
    readable = req.acl is None or req.acl.allow_variable(ns, req.params["path"], "read")
    body = current.wire(items=readable) if current else {"Namespace": ns,
                                                           "Path": req.params["path"]}
    index = current.modify_index if current else 0
    return Response(409, body=body, headers={"X-Nomad-Index": str(index)})


def write_var(api: Api, req: Request) -> Response:
    path, ns = req.params["path"], _namespace(req)
    try:
        body = json.loads(req.body) if req.body else {}
    except ValueError as exc:
        raise NomadError(400, f"invalid character in request body: {exc}") from None
    items = body.get("Items") if isinstance(body, dict) else None
    if not items:
        raise NomadError(400, "variable missing required Items object")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
        raise NomadError(400, "json: cannot unmarshal into Go struct field "
                              "VariableDecrypted.Items of type string")
    validate_path(path)
    if sum(len(k) + len(v) for k, v in items.items()) > _MAX_SIZE:
        raise NomadError(400, "variables are limited to 64KiB in total size")
    cas = _cas(req)
    with api.store.cond:
        table = _vars(api)
        current = table.get((ns, path))
        if cas is not None and (current.modify_index if current else 0) != cas:
            return _conflict(req, current, ns)
        idx = api.store.write("variables")
        now = time.time_ns()
        v = Variable(namespace=ns, path=path, items=dict(items),
                     create_index=current.create_index if current else idx, modify_index=idx,
                     create_time=current.create_time if current else now, modify_time=now)
        table[(ns, path)] = v
        return Response(body=v.wire(), headers={"X-Nomad-Index": str(idx)})


def delete_var(api: Api, req: Request) -> Response:
    path, ns = req.params["path"], _namespace(req)
    validate_path(path)   # canonicalizeAndValidate checks a delete's path too
    cas = _cas(req)
    with api.store.cond:
        table = _vars(api)
        current = table.get((ns, path))
        if cas is not None and (current.modify_index if current else 0) != cas:
            return _conflict(req, current, ns)
        idx = api.store.write("variables")
        table.pop((ns, path), None)
        return Response(204, text="", headers={"X-Nomad-Index": str(idx)})


def list_vars(api: Api, req: Request) -> Response:
    prefix = req.query.get("prefix", "")
    with api.store.cond:
        out = [v.wire(items=False) for (ns, p), v in sorted(_vars(api).items())
               if req.namespace in ("*", ns) and p.startswith(prefix)
               and (req.acl is None or req.acl.allow_variable(ns, p, "list"))]
        return Response(body=out, headers=meta(api.store.table_index.get("variables", 1)))


ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(r"/v1/vars"), {"GET": list_vars}),
    (re.compile(r"/v1/var/(?P<path>.+)"), {"GET": read_var, "PUT": write_var,
                                            "POST": write_var, "DELETE": delete_var}),
]


# -- the client side: a task's templates ----------------------------------------------------

class TemplateBlockedError(Exception):
    """The template cannot render yet; the task does not start. ``str()`` says why, in the
    words of the task event Nomad records."""


def render_env(api: Api, registry: Registry | None, claim: Claim,
               task: Json) -> dict[str, str]:
    """The environment the task's ``Envvars`` templates give it, read with ``claim``."""
    acl = Acl(registry.for_workload(claim), claim=claim) if registry else None
    env: dict[str, str] = {}
    for tmpl in task.get("Templates") or []:
        if not tmpl.get("Envvars"):
            continue
        text = str(tmpl.get("EmbeddedTmpl") or "")
        rendered = _WITH.sub(lambda m: _with(api, acl, claim.namespace, m), text)
        if "{{" in rendered:
            raise NotImplementedError(f"the fake renders only `with nomadVar` blocks reading "
                                      f"`.KEY`; cannot render {text!r}")
        for line in rendered.splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key and not key.startswith("#"):
                env[key] = value
    return env


def _with(api: Api, acl: Acl | None, namespace: str, m: re.Match[str]) -> str:
    path = m.group(1)
    if acl is not None and not acl.allow_variable(namespace, path, "read"):
        raise TemplateBlockedError(f"Template failed: nomad.var.get({path}@{namespace}): "
                                   "Permission denied")
    with api.store.cond:
        v = api.variables.get((namespace, path))
        items: dict[str, str] | None = dict(v.items) if v else None
    if items is None:
        raise TemplateBlockedError(f"Missing: nomad.var.block({path}@{namespace})")

    found = items

    def key(k: re.Match[str]) -> str:
        return found.get(k.group(1), "<no value>")   # Go templates print a missing key so
    return _KEY.sub(key, m.group(2))
