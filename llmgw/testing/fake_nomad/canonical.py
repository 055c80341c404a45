"""The defaults Nomad fills in, and the constraints it adds behind your back.

Two layers run on every submitted job (docs/nomad-api.md §1.2): the agent's
``api.Job.Canonicalize()`` (api/jobs.go, api/tasks.go, api/resources.go,
api/services.go) and the server's admission mutators. Reproduced here:

* §1.2 defaults: Type service, Region global, Namespace default, Priority 50, Name = ID,
  Datacenters ``["*"]``, NodePool ``default``, Count 1 (or Scaling.Min), Restart /
  Reschedule / Update / Migrate policies per job type, EphemeralDisk 300 MB, LogConfig,
  KillTimeout 5 s, device Count 1, affinity weight 50, service name
  ``<job>-<group>[-<task>]``, AddressMode ``auto``, OnUpdate ``require_healthy``;
* §1.3 resources: ``CPU: 100`` only when *both* CPU and Cores are absent; with Cores
  and no CPU, CPU is 0; MemoryMB 300 when absent;
* §1.5 ``Service.Provider`` defaults to **consul**, and the implied-constraint mutator
  (nomad/job_endpoint_hooks.go) then adds ``${attr.consul.version} semver >= 1.8.0``
  to the group — on a Consul-less cluster the job is valid, registered, and never
  placed. Nomad-provider services get ``${attr.nomad.service_discovery} = true`` and,
  with checks, ``${attr.nomad.version} semver >= 1.4.0``; bridge networking gets the
  CNI plugin constraints. The added constraints are stored in the job, as in Nomad.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

from typing import Any

from llmgw.testing.fake_nomad.gotext import seconds

Json = dict[str, Any]

_SERVICE_RESTART = {"Attempts": 2, "Interval": seconds(1800), "Delay": seconds(15),
                    "Mode": "fail", "RenderTemplates": False}
_BATCH_RESTART = {"Attempts": 3, "Interval": seconds(86400), "Delay": seconds(15),
                  "Mode": "fail", "RenderTemplates": False}
_SERVICE_RESCHEDULE = {"Attempts": 0, "Interval": 0, "Delay": seconds(30),
                       "DelayFunction": "exponential", "MaxDelay": seconds(3600),
                       "Unlimited": True}
_BATCH_RESCHEDULE = {"Attempts": 1, "Interval": seconds(86400), "Delay": seconds(5),
                     "DelayFunction": "constant", "MaxDelay": 0, "Unlimited": False}
_OTHER_RESCHEDULE = {"Attempts": 0, "Interval": 0, "Delay": 0, "DelayFunction": "",
                     "MaxDelay": 0, "Unlimited": False}
UPDATE_DEFAULTS = {"Stagger": seconds(30), "MaxParallel": 1, "HealthCheck": "checks",
                   "MinHealthyTime": seconds(10), "HealthyDeadline": seconds(300),
                   "ProgressDeadline": seconds(600), "AutoRevert": False, "Canary": 0,
                   "AutoPromote": False}
_MIGRATE = {"MaxParallel": 1, "HealthCheck": "checks", "MinHealthyTime": seconds(10),
            "HealthyDeadline": seconds(300)}

CONSUL_CONSTRAINT = {"LTarget": "${attr.consul.version}", "RTarget": ">= 1.8.0",
                     "Operand": "semver"}
NOMAD_SD_CONSTRAINT = {"LTarget": "${attr.nomad.service_discovery}", "RTarget": "true",
                       "Operand": "="}
NOMAD_CHECKS_CONSTRAINT = {"LTarget": "${attr.nomad.version}", "RTarget": ">= 1.4.0",
                           "Operand": "semver"}
_CNI = [{"LTarget": f"${{attr.plugins.cni.version.{p}}}", "RTarget": ">= 0.4.0",
         "Operand": "semver"} for p in ("bridge", "firewall", "host-local", "loopback",
                                        "portmap")]


def _fill(obj: Json, defaults: Json) -> Json:
    for key, value in defaults.items():
        obj.setdefault(key, value)
    return obj


def _update_empty(u: Json) -> bool:
    """api.UpdateStrategy.Empty: every field absent or zero."""
    return not any(u.get(k) for k in UPDATE_DEFAULTS)


def canonicalize(job: Json) -> Json:
    """Fill defaults in place and add the implied constraints; returns ``job``."""
    job.setdefault("ID", "")
    job.setdefault("Name", job["ID"])
    _fill(job, {"ParentID": "", "Namespace": "default", "Priority": 50, "Stop": False,
                "Region": "global", "Type": "service", "AllAtOnce": False,
                "ConsulNamespace": "", "VaultNamespace": "", "NomadTokenID": "",
                "Status": "", "StatusDescription": "", "Stable": False, "Version": 0,
                "CreateIndex": 0, "ModifyIndex": 0, "JobModifyIndex": 0, "Meta": None})
    if not job.get("NodePool"):
        job["NodePool"] = "default"  # server-side: "" resolves to the default pool
    if not job.get("Datacenters"):
        job["Datacenters"] = ["*"]  # nomad/structs/structs.go:4686
    jtype = job["Type"]
    if "Update" in job:
        _fill(job["Update"], UPDATE_DEFAULTS)
    elif jtype in ("service", "system"):
        job["Update"] = dict(UPDATE_DEFAULTS)
    for tg in job.get("TaskGroups", []):
        _group(tg, job)
    for a in job.get("Affinities", []):
        a.setdefault("Weight", 50)
    for sp in job.get("Spreads", []):  # api/tasks.go Spread.Canonicalize
        sp.setdefault("Weight", 50)
    job["UI"] = _ui(job.get("UI"))
    _implied_constraints(job)
    return job


def _ui(ui: Json | None) -> Json | None:
    """api/jobs.go ``JobUIConfig.Canonicalize`` (no links: nil), then the agent's copy into
    the server struct, whose link field is ``Url`` (command/agent/job_endpoint.go
    ``ApiJobUIConfigToStructs``): what the job's reads answer (docs/nomad-api.md §1.9)."""
    if ui is None:
        return None
    links = [{"Label": link.get("Label", ""), "Url": link.get("URL", "")}
             for link in ui.get("Links") or () if link is not None]
    return {"Description": ui.get("Description", ""), "Links": links or None}


def _group(tg: Json, job: Json) -> None:
    jtype = job["Type"]
    tg.setdefault("Name", "")
    if "Count" not in tg:
        scaling_min = (tg.get("Scaling") or {}).get("Min")
        tg["Count"] = int(scaling_min) if scaling_min is not None else 1
    if "Scaling" in tg:
        _fill(tg["Scaling"], {"Min": tg["Count"], "Enabled": True, "Type": "horizontal"})
    _fill(tg.setdefault("EphemeralDisk", {}), {"Sticky": False, "Migrate": False, "SizeMB": 300})
    job_update = job.get("Update")
    if job_update is not None and "Update" in tg:
        tg["Update"] = {**job_update, **tg["Update"]}
    elif job_update is not None and not _update_empty(job_update):
        tg["Update"] = dict(job_update)
    if "Update" in tg:
        _fill(tg["Update"], UPDATE_DEFAULTS)
    if "Reschedule" in job:
        tg["ReschedulePolicy"] = {**job["Reschedule"], **tg.get("ReschedulePolicy", {})}
    if "ReschedulePolicy" in tg or jtype not in ("system", "sysbatch"):
        base = {"service": _SERVICE_RESCHEDULE, "batch": _BATCH_RESCHEDULE}.get(
            jtype, _OTHER_RESCHEDULE)
        _fill(tg.setdefault("ReschedulePolicy", {}), base)
    if "Migrate" in job:
        tg["Migrate"] = {**job["Migrate"], **tg.get("Migrate", {})}
    if "Migrate" in tg or jtype == "service":
        _fill(tg.setdefault("Migrate", {}), _MIGRATE)
    restart = _SERVICE_RESTART if jtype in ("service", "system") else _BATCH_RESTART
    tg["RestartPolicy"] = {**restart, **tg.get("RestartPolicy", {})}
    for task in tg.get("Tasks", []):
        _task(task, tg, job)
    for a in tg.get("Affinities", []):
        a.setdefault("Weight", 50)
    for sp in tg.get("Spreads", []):
        sp.setdefault("Weight", 50)
    for net in tg.get("Networks", []):  # structs.NetworkResource.Canonicalize; Mode stays ""
        for port in net.get("DynamicPorts", []) + net.get("ReservedPorts", []):
            if not port.get("HostNetwork"):
                port["HostNetwork"] = "default"
    for svc in tg.get("Services", []):
        _service(svc, job, tg, None)


def _task(task: Json, tg: Json, job: Json) -> None:
    res = task.setdefault("Resources", {})
    if "Cores" not in res:
        res["Cores"] = 0
        res.setdefault("CPU", 100)  # only when both CPU and Cores are absent (§1.3)
    res.setdefault("CPU", 0)
    res.setdefault("MemoryMB", 300)
    for dev in res.get("Devices", []):
        dev.setdefault("Count", 1)
        for a in dev.get("Affinities", []):
            a.setdefault("Weight", 50)
    task.setdefault("KillTimeout", seconds(5))
    _fill(task.setdefault("LogConfig", {}), {"MaxFiles": 10, "MaxFileSizeMB": 10,
                                              "Disabled": False})
    for tmpl in task.get("Templates", []):
        _fill(tmpl, {"ChangeMode": "restart", "Splay": seconds(5), "Perms": "0644",
                     "LeftDelim": "{{", "RightDelim": "}}", "Envvars": False})
    for a in task.get("Affinities", []):
        a.setdefault("Weight", 50)
    lifecycle = task.get("Lifecycle")
    if lifecycle is not None and not lifecycle.get("Hook") and not lifecycle.get("Sidecar"):
        del task["Lifecycle"]  # api TaskLifecycle.Empty()
    task["RestartPolicy"] = {**tg["RestartPolicy"], **task.get("RestartPolicy", {})}
    for svc in task.get("Services", []):
        _service(svc, job, tg, task)


def _service(svc: Json, job: Json, tg: Json, task: Json | None) -> None:
    if not svc.get("Name"):
        suffix = f"-{task['Name']}" if task is not None else ""
        svc["Name"] = f"{job['Name']}-{tg['Name']}{suffix}"
    for key, value in (("AddressMode", "auto"), ("OnUpdate", "require_healthy"),
                       ("Provider", "consul"), ("Cluster", "default")):
        if not svc.get(key):
            svc[key] = value
    for check in svc.get("Checks", []):
        if not check.get("OnUpdate"):
            check["OnUpdate"] = svc["OnUpdate"]
        if not check.get("Name"):
            check["Name"] = f'service: "{svc["Name"]}" check'
        restart = {**(svc.get("CheckRestart") or {}), **(check.get("CheckRestart") or {})}
        if restart:
            check["CheckRestart"] = _fill(restart, {"Limit": 0, "Grace": seconds(1),
                                                    "IgnoreWarnings": False})


def _add(target: Json, constraint: Json, *, full: bool) -> None:
    """MutateConstraint: ``full`` matches the whole constraint, otherwise only LTarget."""
    existing = target.setdefault("Constraints", [])
    for c in existing:
        if c.get("LTarget") == constraint["LTarget"] and (not full or c == constraint):
            return
    existing.append(dict(constraint))


def _implied_constraints(job: Json) -> None:
    """JobImpliedConstraints.Mutate (nomad/job_endpoint_hooks.go), the parts llmgw meets."""
    for tg in job.get("TaskGroups", []):
        services = list(tg.get("Services", []))
        for task in tg.get("Tasks", []):
            services += task.get("Services", [])
        nomad = [s for s in services if s.get("Provider") == "nomad"]
        if nomad:
            _add(tg, NOMAD_SD_CONSTRAINT, full=True)
        if any(s.get("Checks") for s in nomad):
            _add(tg, NOMAD_CHECKS_CONSTRAINT, full=True)
        if any(s.get("Provider") == "consul" for s in tg.get("Services", [])):
            _add(tg, CONSUL_CONSTRAINT, full=False)
        for task in tg.get("Tasks", []):
            if any(s.get("Provider") == "consul" for s in task.get("Services", [])):
                _add(task, CONSUL_CONSTRAINT, full=False)
        if any(n.get("Mode") == "bridge" for n in tg.get("Networks", [])):
            for c in _CNI:
                _add(tg, c, full=False)
