"""Nomad's job validation, with its messages and its nesting.

A job that decodes but is invalid is refused by the server's ``jobValidate`` admission
hook with a go-multierror (nomad/job_endpoint_hooks.go l.211-227). On
``PUT /v1/jobs`` that error has no RPC code and arrives as **HTTP 500** with the
multierror text (docs/nomad-api.md §7); on ``/v1/validate/job`` the same errors come back
one per line in ``ValidationErrors`` with a 200.

The checks and their wording follow nomad/structs (Job/TaskGroup/Task/Resources/
Service/ServiceCheck/Constraint/UpdateStrategy ``Validate``) at the reference commit,
including how errors nest: a task-level error reads
``Task group serve validation failed: 1 error occurred:\\n\\t* Task server validation
failed: …``. ``validate_job`` returns the top-level list; ``gotext.multi`` renders it.
Only the checks a job of llmgw's shape can trip are reproduced (no periodic,
parameterized, Vault, Connect or CSI rules).
"""

from __future__ import annotations

from typing import Any

from llmgw.testing.fake_nomad import rules
from llmgw.testing.fake_nomad.gotext import duration as d
from llmgw.testing.fake_nomad.gotext import multi
from llmgw.testing.fake_nomad.gotext import quote as q

Json = dict[str, Any]
# nomad/structs/structs.go Job.Validate: MaxDescriptionCharacters
MAX_UI_DESCRIPTION = 1000


def validate_job(job: Json, namespaces: set[str], max_priority: int = 100) -> list[str]:
    """The flattened multierror of every admission validator, in Nomad's order."""
    errs: list[str] = []
    if not job.get("Region"):
        errs.append("Missing job region")
    jid = job.get("ID", "")
    if not jid:
        errs.append("Missing job ID")
    elif " " in jid:
        errs.append("Job ID contains a space")
    elif "\0" in jid:
        errs.append("Job ID contains a null character")
    if not job.get("Name"):
        errs.append("Missing job name")
    if not job.get("Namespace"):
        errs.append("Job must be in a namespace")
    jtype = job.get("Type", "")
    if jtype not in ("service", "batch", "system", "sysbatch", "_core"):
        errs.append("Missing job type" if not jtype else f"Invalid job type: {q(jtype)}")
    dcs = job.get("Datacenters") or []
    if not dcs:
        errs.append("Missing job datacenters")
    errs += ["Job datacenter must be non-empty string" for dc in dcs if dc == ""]
    groups = job.get("TaskGroups") or []
    if not groups:
        errs.append("Missing job task groups")
    errs += _numbered("Constraint", job.get("Constraints", []), rules.constraint)
    errs += _numbered("Affinity", job.get("Affinities", []), rules.affinity)
    seen: dict[str, int] = {}
    for i, tg in enumerate(groups):
        name = tg.get("Name", "")
        if not name:
            errs.append(f"Job task group {i + 1} missing name")
        elif name in seen:
            errs.append(f"Job task group {i + 1} redefines '{name}' from group {seen[name] + 1}")
        else:
            seen[name] = i
        if jtype == "system" and tg.get("Count", 0) > 1:
            errs.append(f"Job task group {name} has count {tg['Count']}. Count cannot exceed 1 "
                        "with system scheduler")
    for tg in groups:
        tg_errs = _group(tg, job)
        if tg_errs:
            errs.append(f"Task group {tg.get('Name', '')} validation failed: {multi(tg_errs)}")
    errs += _numbered("Spread", job.get("Spreads", []), rules.spread)
    # Go's len: bytes of UTF-8, whatever the message says (docs/nomad-api.md §1.9)
    size = len(((job.get("UI") or {}).get("Description") or "").encode())
    if size > MAX_UI_DESCRIPTION:
        errs.append(f"UI description must be under 1000 characters, currently {size}")
    if jtype == "_core":
        errs.append("job type cannot be core")
    if not 1 <= job.get("Priority", 50) <= max_priority:
        errs.append(f"job priority must be between [1, {max_priority}]")
    if job.get("Namespace") and job["Namespace"] not in namespaces:
        errs.append(f"job {q(jid)} is in nonexistent namespace {q(job['Namespace'])}")
    return errs


def _numbered(kind: str, items: list[Json], check: Any) -> list[str]:
    out = []
    for i, item in enumerate(items):
        e = check(item)
        if e:
            out.append(f"{kind} {i + 1} validation failed: {multi(e)}")
    return out







def _group(tg: Json, job: Json) -> list[str]:
    errs: list[str] = []
    name = tg.get("Name", "")
    if not name:
        errs.append("Missing task group name")
    if tg.get("Count", 0) < 0:
        errs.append("Task group count can't be negative")
    tasks = tg.get("Tasks") or []
    if not tasks:
        errs.append("Missing tasks for task group")
    errs += _numbered("Constraint", tg.get("Constraints", []), rules.constraint)
    errs += _numbered("Affinity", tg.get("Affinities", []), rules.affinity)
    errs += rules.restart_policy(tg["RestartPolicy"])
    errs += _numbered("Spread", tg.get("Spreads", []), rules.spread)
    if "ReschedulePolicy" in tg and job["Type"] not in ("system", "sysbatch"):
        errs += rules.reschedule_policy(tg["ReschedulePolicy"])
    if tg["EphemeralDisk"]["SizeMB"] < 10:
        errs.append(f"minimum DiskMB value is 10; got {tg['EphemeralDisk']['SizeMB']}")
    if "Update" in tg:
        if job["Type"] not in ("service", "system"):
            errs.append(f"Job type {q(job['Type'])} does not allow update block")
        errs += rules.update_strategy(tg["Update"])
    names: dict[str, int] = {}
    mains = 0
    for i, task in enumerate(tasks):
        tname = task.get("Name", "")
        if not tname:
            errs.append(f"Task {i + 1} missing name")
        elif tname in names:
            errs.append(f"Task {i + 1} redefines '{tname}' from task {names[tname] + 1}")
        else:
            names[tname] = i
        if "Lifecycle" not in task:
            mains += 1
    if tasks and mains == 0:
        errs.append(f"Task group {name} must have at least one main task")
    for vname, vol in (tg.get("Volumes") or {}).items():
        if vol.get("Type") not in ("host", "csi"):
            errs.append(f"Task group volume validation for {vname} failed: volume has "
                        f"unrecognized type {vol.get('Type', '')}")
        elif not vol.get("Source"):
            errs.append(f"Task group volume validation for {vname} failed: "
                        f"{multi(['volume has an empty source'])}")
    labels: dict[str, str] = {}
    net_errs = []
    for net in tg.get("Networks", []):
        for port in net.get("ReservedPorts", []) + net.get("DynamicPorts", []):
            if port.get("Label", "") in labels:
                net_errs.append(f"Port label {port.get('Label', '')} already in use by "
                                "taskgroup network")
            labels[port.get("Label", "")] = "taskgroup network"
    if net_errs:
        errs.append(f"Task group network validation failed: {multi(net_errs)}")
    svc_errs = _group_services(tg)
    if svc_errs:
        errs.append(f"Task group service validation failed: {multi(svc_errs)}")
    scaling = tg.get("Scaling")
    if scaling is not None:
        if scaling.get("Max") is not None and scaling["Max"] < tg["Count"]:
            errs.append("Scaling policy invalid: task group count must not be greater than "
                        "maximum count in scaling policy")
        if tg["Count"] < scaling.get("Min", 0):
            errs.append("Scaling policy invalid: task group count must not be less than "
                        "minimum count in scaling policy")
    for task in tasks:
        t_errs = _task(task, tg, job)
        if t_errs:
            errs.append(f"Task {task.get('Name', '')} validation failed: {multi(t_errs)}")
    return errs


def _group_services(tg: Json) -> list[str]:
    errs = []
    providers: set[str | None] = set()
    for task in tg.get("Tasks", []):
        providers.update(s.get("Provider") for s in task.get("Services", []))
    for i, svc in enumerate(tg.get("Services", [])):
        providers.add(svc.get("Provider"))
        e = rules.service(svc)
        if e:
            errs.append(f"Service[{i}] {svc.get('Name', '')} validation failed: {multi(e)}")
    if len(providers) > 1:
        errs.append("Multiple service providers used: task group services must use the "
                    "same provider")
    return errs




def _task(task: Json, tg: Json, job: Json) -> list[str]:
    errs: list[str] = []
    name = task.get("Name", "")
    if not name:
        errs.append("Missing task name")
    if name == "alloc":
        errs.append('Task cannot be named "alloc"')
    if "/" in name or "\\" in name:
        errs.append("Task name cannot include slashes")
    if not task.get("Driver"):
        errs.append("Missing task driver")
    pd = (tg.get("Update") or {}).get("ProgressDeadline", 0)
    if job["Type"] == "service" and pd > 0 and task["KillTimeout"] > pd:
        errs.append(f"KillTimout ({d(task['KillTimeout'])}) longer than the group's "
                    f"ProgressDeadline ({d(pd)})")
    res_errs = _resources(task["Resources"])
    if res_errs:
        errs.append(multi(res_errs))
    log = task["LogConfig"]
    if log["MaxFiles"] * log["MaxFileSizeMB"] >= tg["EphemeralDisk"]["SizeMB"]:
        errs.append(multi([f"log storage ({log['MaxFiles'] * log['MaxFileSizeMB']} MB) must be "
                           f"less than requested disk capacity ({tg['EphemeralDisk']['SizeMB']} "
                           "MB)"]))
    errs += _numbered("Constraint", task.get("Constraints", []), rules.constraint)
    for i, c in enumerate(task.get("Constraints", [])):
        if c.get("Operand") in ("distinct_hosts", "distinct_property"):
            errs.append(f"Constraint {i + 1} has disallowed Operand at task level: "
                        f"{c['Operand']}")
    errs += _numbered("Affinity", task.get("Affinities", []), rules.affinity)
    svc_errs = _task_services(task, tg)
    if svc_errs:
        errs.append(multi(svc_errs))
    hook = (task.get("Lifecycle") or {}).get("Hook")
    if "Lifecycle" in task and hook not in ("prestart", "poststart", "poststop"):
        errs.append("Lifecycle validation failed: " +
                    ("no lifecycle hook provided" if not hook else f"invalid hook: {hook}"))
    for i, vm in enumerate(task.get("VolumeMounts", [])):
        if vm.get("Volume") not in (tg.get("Volumes") or {}):
            errs.append(f"Volume Mount ({i}) references undefined volume {vm.get('Volume', '')}")
    return errs


def _task_services(task: Json, tg: Json) -> list[str]:
    """ValidateServices (structs.go l.8440): each service, then every port label it uses."""
    errs = []
    used: dict[str, set[str]] = {}
    for i, svc in enumerate(task.get("Services", [])):
        e = rules.service(svc)
        if e:
            errs.append(f"service[{i}] {q(svc.get('Name', ''))} validation failed: {multi(e)}")
        if svc.get("PortLabel"):
            used.setdefault(svc["PortLabel"], set()).add(svc.get("Name", ""))
        for check in svc.get("Checks", []):
            label = check.get("PortLabel") or svc.get("PortLabel")
            if label and check.get("Type") in ("http", "tcp", "grpc"):
                used.setdefault(label, set()).add(svc.get("Name", ""))
    networks = tg.get("Networks") or []
    labels = {p.get("Label") for p in (networks[0].get("ReservedPorts", []) +
                                       networks[0].get("DynamicPorts", []))} if networks else set()
    errs += [f"port label {q(label)} referenced by services "
             f"{', '.join(sorted(used[label]))} does not exist"
             for label in sorted(used) if label not in labels]
    return errs


def _resources(r: Json) -> list[str]:
    errs = []
    cpu, cores, mem = r.get("CPU", 0), r.get("Cores", 0), r.get("MemoryMB", 0)
    if cores > 0 and cpu > 0:
        errs.append("Task can only ask for 'cpu' or 'cores' resource, not both.")
    if cores < 0:
        errs.append(f"cores value ({cores}) cannot be negative")
    minimum = []
    if cpu < 1 and cores == 0:
        minimum.append(f"minimum CPU value is 1; got {cpu}")
    if mem < 10:
        minimum.append(f"minimum MemoryMB value is 10; got {mem}")
    if minimum:
        errs.append(multi(minimum))
    if r.get("DiskMB", 0) > 0:
        errs.append("Task can't ask for disk resources, they have to be specified at the task "
                    "group level.")
    for i, dev in enumerate(r.get("Devices", [])):
        dev_errs = [] if dev.get("Name") else [
            "device name must be given as one of the following: type, vendor/type, or "
            "vendor/type/name"]
        for j, c in enumerate(dev.get("Constraints", [])):
            if c.get("Operand") in ("distinct_hosts", "distinct_property"):
                dev_errs.append(f"Constraint {j + 1} validation failed: using unsupported "
                                f"operand {q(c['Operand'])}")
            elif e := rules.constraint(c):
                dev_errs.append(f"Constraint {j + 1} validation failed: {multi(e)}")
        if dev_errs:
            errs.append(f"device {i + 1} failed validation: {multi(dev_errs)}")
    mmax = r.get("MemoryMaxMB", 0)
    if mmax not in (0, -1) and mmax < mem:
        errs.append(f"MemoryMaxMB value ({mmax}) should be larger than MemoryMB value ({mem})")
    return errs


def job_warnings(job: Json) -> list[str]:
    """MemoryOversubscriptionValidate: MemoryMaxMB is ignored unless the scheduler allows it."""
    return [f"Memory oversubscription is not enabled; Task "
            f"\"{tg.get('Name', '')}.{t.get('Name', '')}\" memory_max value will be ignored. "
            "Update the Scheduler Configuration to allow oversubscription."
            for tg in job.get("TaskGroups", []) for t in tg.get("Tasks", [])
            if (t.get("Resources") or {}).get("MemoryMaxMB", 0) != 0]
