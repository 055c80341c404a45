"""``/v1/jobs``, ``/v1/job/:id/…`` and ``/v1/validate/job``.

Bodies go through ``decode`` (Go's decoder, strict or not), then the agent's checks
(command/agent/job_endpoint.go ``jobUpdate``/``jobPlan``: ``Job must be specified``,
``Job ID hasn't been provided``, ``Job ID does not match name``), then canonicalisation
and validation, as in Nomad; a register then has its host volumes checked against the
token (``acl.check_volumes``), which a plan never has. The unknown-job answers differ per
endpoint on purpose (docs/nomad-api.md §7, §9.11): ``GET /v1/job/:id``, ``/summary``,
``/scale``, ``/services`` are 404 ``job not found``; ``/allocations``, ``/evaluations``,
``/deployments`` are ``[]``; ``/deployment`` is ``null``; ``/versions`` is 404 ``job
versions not found``; ``POST /scale`` is 404 ``job "x" not found``; ``DELETE`` is a 200
with an empty EvalID.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import re
from typing import Any

from llmgw.testing.fake_nomad import acl, wire
from llmgw.testing.fake_nomad.canonical import canonicalize
from llmgw.testing.fake_nomad.cluster import NomadError, write_response
from llmgw.testing.fake_nomad.decode import DecodeError, decode
from llmgw.testing.fake_nomad.gotext import multi
from llmgw.testing.fake_nomad.gotext import warnings as format_warnings
from llmgw.testing.fake_nomad.records import JobRecord
from llmgw.testing.fake_nomad.server import Api, Request, Response, Route, meta
from llmgw.testing.fake_nomad.validate import job_warnings, validate_job

Json = dict[str, Any]


def _decode(api: Api, req: Request, root: str) -> Json:
    try:
        return decode(req.body, root, strict=api.strict)
    except DecodeError as exc:
        raise NomadError(400, str(exc)) from None


def _prepare(api: Api, req: Request, body: Json, job: Json) -> Json:
    """ApiJobAndRequestToStructs: region and namespace precedence, then canonicalize."""
    region = req.query.get("region") or body.get("Region") or job.get("Region") or ""
    if region in ("", "global"):
        region = api.region
    if region != api.region:
        raise NomadError(500, "No path to region")
    job["Region"] = region
    job["Namespace"] = (req.query.get("namespace") or body.get("Namespace")
                        or job.get("Namespace") or "default")
    return canonicalize(job)


def _valid_job(api: Api, req: Request, body: Json, job: Json) -> tuple[Json, str]:
    job = _prepare(api, req, body, job)
    errors = validate_job(job, api.store.namespaces)
    if errors:  # no RPC code on a validation multierror: HTTP 500 (§7)
        raise NomadError(500, multi(errors))
    return job, format_warnings(job_warnings(job))


def register(api: Api, req: Request) -> Response:
    url_id = req.params.get("id")
    body = _decode(api, req, "JobRegisterRequest")
    job = body.get("Job")
    if job is None:
        raise NomadError(400, "Job must be specified")
    if "ID" not in job:
        raise NomadError(400, "Job ID hasn't been provided")
    if url_id is not None and job["ID"] != url_id:
        raise NomadError(400, "Job ID does not match name")
    if job.get("Type") == "system" and any("Scaling" in tg for tg in job.get("TaskGroups", [])):
        raise NomadError(400, "Task groups with job type system do not support scaling blocks")
    job, warnings = _valid_job(api, req, body, job)
    if req.acl is not None:   # after admission, as doRegister orders it; Plan never checks
        acl.check_volumes(req.acl, job)
    out = api.cluster.register(job, enforce_index=body.get("EnforceIndex", False),
                               job_modify_index=body.get("JobModifyIndex", 0),
                               eval_priority=body.get("EvalPriority", 0),
                               preserve_counts=body.get("PreserveCounts", False),
                               warnings=warnings)
    return Response(body=out, headers={"X-Nomad-Index": str(out["Index"])})


def plan(api: Api, req: Request) -> Response:
    body = _decode(api, req, "JobPlanRequest")
    job = body.get("Job")
    if job is None:
        raise NomadError(400, "Job must be specified")
    if "ID" not in job:
        raise NomadError(400, "Job must have a valid ID")
    if job["ID"] != req.params["id"]:
        raise NomadError(400, "Job ID does not match")
    job, warnings = _valid_job(api, req, body, job)
    out = api.cluster.plan(job, diff=body.get("Diff", False))
    out["Warnings"] = warnings
    return Response(body=out, headers={"X-Nomad-Index": str(out["Index"])})


def validate(api: Api, req: Request) -> Response:
    body = _decode(api, req, "JobValidateRequest")
    job = body.get("Job")
    if job is None:
        raise NomadError(400, "Job must be specified")
    job = _prepare(api, req, body, job)
    errors = validate_job(job, api.store.namespaces)
    return Response(body={"DriverConfigValidated": True, "ValidationErrors": errors or None,
                          "Error": multi(errors),
                          "Warnings": format_warnings(job_warnings(job))})


def _record(api: Api, req: Request) -> JobRecord | None:
    return api.store.jobs.get((req.namespace, req.params["id"]))


def list_jobs(api: Api, req: Request) -> Response:
    def body() -> list[Json]:
        recs = sorted(api.store.jobs.values(), key=lambda r: (r.namespace, r.id))
        prefix = req.query.get("prefix", "")
        return [wire.job_stub(r, api.store.job_status(r), api.store.summary(r),
                              meta=req.flag("meta"))
                for r in recs if r.id.startswith(prefix)
                and req.namespace in ("*", r.namespace)]
    return api.blocking(req, lambda: api.store.read_index("jobs", "job_summary"), body)


def get_job(api: Api, req: Request) -> Response:
    def index() -> int:
        rec = _record(api, req)
        return rec.modify_index if rec else api.store.read_index("jobs")
    return api.blocking(req, index, lambda: wire.job(_found(api, req),
                                                     api.store.job_status(_found(api, req))))


def _found(api: Api, req: Request, missing: str = "job not found") -> JobRecord:
    rec = _record(api, req)
    if rec is None:
        raise NomadError(404, missing)
    return rec


def delete_job(api: Api, req: Request) -> Response:
    flags = {}
    for name in ("purge", "global"):
        raw = req.query.get(name, "")
        if raw and raw.lower() not in ("1", "t", "true", "0", "f", "false"):
            raise NomadError(500, f'Failed to parse value of "{name}" ({raw}) as a bool: '
                                  f'strconv.ParseBool: parsing "{raw}": invalid syntax')
        flags[name] = raw.lower() in ("1", "t", "true")
    out = api.cluster.deregister(req.namespace, req.params["id"], purge=flags["purge"])
    return Response(body=out, headers={"X-Nomad-Index": str(out["Index"])})


def _table(api: Api, req: Request, table: str, items: Any) -> Response:
    return api.blocking(req, lambda: api.store.read_index(table), items)


def job_allocations(api: Api, req: Request) -> Response:
    def body() -> list[Json]:
        rec = _record(api, req)
        allocs = api.store.job_allocs(req.namespace, req.params["id"])
        if rec is not None and not req.flag("all"):  # AllocsByJob: same job instance only
            allocs = [a for a in allocs if a.job.get("CreateIndex") == rec.create_index]
        return [wire.alloc_stub(a) for a in sorted(allocs, key=lambda a: a.create_index)]
    return _table(api, req, "allocs", body)


def job_evaluations(api: Api, req: Request) -> Response:
    return _table(api, req, "evals", lambda: [
        wire.evaluation(e) for e in sorted(api.store.job_evals(req.namespace, req.params["id"]),
                                           key=lambda e: e.create_index)])


def job_deployments(api: Api, req: Request) -> Response:
    return _table(api, req, "deployment", lambda: [
        wire.deployment(d) for d in api.store.job_deployments(req.namespace, req.params["id"])])


def job_deployment(api: Api, req: Request) -> Response:
    def body() -> Json | None:
        d = api.store.latest_deployment(req.namespace, req.params["id"])
        return wire.deployment(d) if d else None
    return _table(api, req, "deployment", body)


def job_summary(api: Api, req: Request) -> Response:
    return _table(api, req, "job_summary", lambda: api.store.summary(_found(api, req)))


def job_versions(api: Api, req: Request) -> Response:
    def body() -> Json:
        rec = _found(api, req, "job versions not found")
        return {"Versions": list(reversed(rec.versions)), "Diffs": None,
                "Index": api.store.read_index("job_version"), "LastContact": 0,
                "KnownLeader": True, "NextToken": ""}
    return _table(api, req, "job_version", body)


def job_services(api: Api, req: Request) -> Response:
    def body() -> list[Json]:
        _found(api, req)
        return [wire.service(s) for s in sorted(api.store.services.values(),
                                                 key=lambda s: s.create_index)
                if s.namespace == req.namespace and s.job_id == req.params["id"]]
    return _table(api, req, "service_registrations", body)


def scale_status(api: Api, req: Request) -> Response:
    with api.store.cond:
        rec = _found(api, req)
        d = api.store.latest_deployment(req.namespace, rec.id)
        groups = {}
        for tg in rec.spec["TaskGroups"]:
            allocs = [a for a in api.store.job_allocs(rec.namespace, rec.id)
                      if a.task_group == tg["Name"] and not a.terminal]
            dg = d.task_groups.get(tg["Name"]) if d else None
            groups[tg["Name"]] = {
                "Desired": tg["Count"], "Placed": len(allocs),
                "Running": sum(a.client_status == "running" for a in allocs),
                "Healthy": dg.healthy_allocs if dg else 0,
                "Unhealthy": dg.unhealthy_allocs if dg else 0,
                "Events": list(rec.scaling_events.get(tg["Name"], [])) or None}
        body = {"JobID": rec.id, "Namespace": rec.namespace, "JobCreateIndex": rec.create_index,
                "JobModifyIndex": rec.job_modify_index, "JobStopped": rec.spec["Stop"],
                "TaskGroups": groups}
        return Response(body=body, headers=meta(api.store.read_index("jobs", "allocs")))


def scale(api: Api, req: Request) -> Response:
    body = _decode(api, req, "ScalingRequest")
    target = body.get("Target") or {}
    if target.get("Job") and target["Job"] != req.params["id"]:
        raise NomadError(400, "job ID in payload did not match URL")
    if target.get("Namespace") and target["Namespace"] != req.namespace:
        raise NomadError(400, "namespace in payload did not match header")
    if not target.get("Group"):
        raise NomadError(400, "missing task group name for scaling action")
    count = body.get("Count")
    if count is not None and count < 0:
        raise NomadError(400, "scaling action count can't be negative")
    if count is not None and body.get("Error"):
        raise NomadError(400, "scaling action should not contain count if error is true")
    out = api.cluster.scale(req.namespace, req.params["id"], target["Group"], count, body)
    return Response(body=out, headers={"X-Nomad-Index": str(out["Index"])})


def evaluate(api: Api, req: Request) -> Response:
    """Job.Evaluate: a fresh evaluation of the job as it stands (``nomad job eval``)."""
    store = api.store
    with store.cond:
        rec = store.jobs.get((req.namespace, req.params["id"]))
        if rec is None:
            raise NomadError(500, "job not found")
        idx = store.write("evals")
        ev = api.cluster.new_eval(rec.namespace, rec.id, rec.spec["Priority"], "job-register",
                                  index=idx, job_modify_index=rec.job_modify_index,
                                  job_type=rec.spec["Type"])
        out = write_response(ev.id, idx, rec.job_modify_index, idx)
    return Response(body=out, headers={"X-Nomad-Index": str(idx)})


_ID = r"/v1/job/(?P<id>.+?)"
ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(r"/v1/jobs"), {"GET": list_jobs, "PUT": register, "POST": register}),
    (re.compile(r"/v1/validate/job"), {"PUT": validate, "POST": validate}),
    (re.compile(_ID + "/plan"), {"PUT": plan, "POST": plan}),
    (re.compile(_ID + "/evaluate"), {"PUT": evaluate, "POST": evaluate}),
    (re.compile(_ID + "/allocations"), {"GET": job_allocations}),
    (re.compile(_ID + "/evaluations"), {"GET": job_evaluations}),
    (re.compile(_ID + "/deployments"), {"GET": job_deployments}),
    (re.compile(_ID + "/deployment"), {"GET": job_deployment}),
    (re.compile(_ID + "/summary"), {"GET": job_summary}),
    (re.compile(_ID + "/versions"), {"GET": job_versions}),
    (re.compile(_ID + "/services"), {"GET": job_services}),
    (re.compile(_ID + "/scale"), {"GET": scale_status, "PUT": scale, "POST": scale}),
    (re.compile(r"/v1/job/(?P<id>.+)"), {"GET": get_job, "PUT": register, "POST": register,
                                        "DELETE": delete_job}),
]
