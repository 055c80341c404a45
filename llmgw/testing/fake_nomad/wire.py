"""Records rendered as Nomad puts them on the wire (server structs, go-codec JSON).

Responses are encoded from ``nomad/structs``, not from ``api.*`` (docs/nomad-api.md,
"General wire conventions"), which shows in details a client must cope with:

* ``Allocation`` and ``Evaluation`` carry ``_struct codec:",omitempty"``: zero-valued
  fields are left out of ``GET /v1/allocation/:id``, ``/v1/node/:id/allocations`` and
  evaluation bodies (``full_alloc``/``evaluation`` drop them); list stubs keep them;
* nil maps and slices are ``null``, not ``{}``/``[]``;
* ``Drain`` on a node is derived from its drain strategy;
* times are RFC 3339 strings, ``CreateTime``/``ModifyTime`` Unix nanoseconds, a check's
  ``Timestamp`` Unix seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from llmgw.testing.fake_nomad.records import (
    Alloc,
    CheckResult,
    Deployment,
    Eval,
    JobRecord,
    Node,
    ServiceReg,
    TaskAlloc,
)

Json = dict[str, Any]
ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ns: int) -> str:
    if not ns:
        return ZERO_TIME
    secs, frac = divmod(ns, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(secs, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{frac:09d}".rstrip("0").rstrip(".") + "Z"


def _omit_zero(obj: Json) -> Json:
    return {k: v for k, v in obj.items() if v not in (None, "", 0, False, [], {}, ZERO_TIME)}


def _nil(value: Any) -> Any:
    return value or None


def job(rec: JobRecord, status: str) -> Json:
    out = dict(rec.spec)
    out["Status"] = status
    return out


def job_stub(rec: JobRecord, status: str, summary: Json, *, meta: bool) -> Json:
    s = rec.spec
    out = {
        "ID": s["ID"], "ParentID": s.get("ParentID", ""), "Name": s["Name"],
        "Namespace": s["Namespace"], "Datacenters": s["Datacenters"], "NodePool": s["NodePool"],
        "Multiregion": None, "Type": s["Type"], "Priority": s["Priority"], "Periodic": False,
        "ParameterizedJob": False, "Stop": s["Stop"], "Status": status,
        "StatusDescription": s.get("StatusDescription", ""), "JobSummary": summary,
        "CreateIndex": rec.create_index, "ModifyIndex": rec.modify_index,
        "JobModifyIndex": rec.job_modify_index, "SubmitTime": s["SubmitTime"],
    }
    if meta and s.get("Meta"):
        out["Meta"] = s["Meta"]
    return out


def _task_resources(t: TaskAlloc) -> Json:
    return {
        "Cpu": {"CpuShares": t.cpu_shares, "ReservedCores": _nil(t.reserved_cores)},
        "Memory": {"MemoryMB": t.memory_mb, "MemoryMaxMB": t.memory_max_mb},
        "Networks": None,
        "Devices": _nil([{"Vendor": d.vendor, "Type": d.type, "Name": d.name,
                          "DeviceIDs": d.device_ids} for d in t.devices]),
    }


def allocated_resources(a: Alloc) -> Json:
    lifecycles: dict[str, Json | None] = {}
    for name, t in a.tasks.items():
        hook = {"prestart": ("prestart", False), "sidecar": ("prestart", True),
                "poststart": ("poststart", False), "poststop": ("poststop", False)}.get(t.stage)
        lifecycles[name] = {"Hook": hook[0], "Sidecar": hook[1]} if hook else None
    ip = a.ports[0].host_ip if a.ports else ""
    networks = [{"Mode": "host", "Device": "", "CIDR": "", "IP": ip, "Hostname": "",
                 "MBits": 0, "DNS": None, "ReservedPorts": None,
                 "DynamicPorts": [{"Label": p.label, "Value": p.value, "To": p.to,
                                   "HostNetwork": "default", "IgnoreCollision": False}
                                  for p in a.ports]}] if a.ports else None
    return {
        "Tasks": {name: _task_resources(t) for name, t in a.tasks.items()},
        "TaskLifecycles": lifecycles,
        "Shared": {"Networks": networks, "DiskMB": a.disk_mb,
                   "Ports": _nil([{"Label": p.label, "Value": p.value, "To": p.to,
                                   "HostIP": p.host_ip} for p in a.ports])},
    }


def _task_states(a: Alloc) -> Json | None:
    if not a.task_states:
        return None
    return {name: {"State": s.state, "Failed": s.failed, "Restarts": s.restarts,
                   "LastRestart": ZERO_TIME, "StartedAt": s.started_at or ZERO_TIME,
                   "FinishedAt": s.finished_at or ZERO_TIME, "Events": s.events,
                   "TaskHandle": None, "Paused": ""}
            for name, s in a.task_states.items()}


def _deployment_status(a: Alloc) -> Json | None:
    if not a.deployment_id:
        return None
    return {"Healthy": a.healthy, "Timestamp": a.health_time or ZERO_TIME, "Canary": False,
            "ModifyIndex": a.modify_index}


def _reschedule(a: Alloc) -> Json | None:
    return {"Events": a.reschedule_events, "LastReschedule": ""} if a.reschedule_events else None


def alloc_stub(a: Alloc, *, resources: bool = False, task_states: bool = True) -> Json:
    out = {
        "ID": a.id, "EvalID": a.eval_id, "Name": a.name, "Namespace": a.namespace,
        "NodeID": a.node_id, "NodeName": a.node_name, "JobID": a.job_id,
        "JobType": a.job.get("Type", "service"), "JobVersion": a.job_version,
        "TaskGroup": a.task_group, "DesiredStatus": a.desired_status,
        "DesiredDescription": a.desired_description, "ClientStatus": a.client_status,
        "ClientDescription": a.client_description,
        "DesiredTransition": {"Migrate": a.migrate or None, "Reschedule": None,
                              "ForceReschedule": None, "NoShutdownDelay": None},
        "TaskStates": _task_states(a) if task_states else None,
        "DeploymentStatus": _deployment_status(a), "FollowupEvalID": a.followup_eval_id,
        "NextAllocation": a.next_allocation, "RescheduleTracker": _reschedule(a),
        "PreemptedAllocations": None, "PreemptedByAllocation": "",
        "CreateIndex": a.create_index, "ModifyIndex": a.modify_index,
        "CreateTime": a.create_time, "ModifyTime": a.modify_time,
    }
    if resources:
        out["AllocatedResources"] = allocated_resources(a)
    return out


def full_alloc(a: Alloc) -> Json:
    out = alloc_stub(a)
    del out["JobType"], out["JobVersion"]
    out.update({
        "Job": a.job, "Resources": None, "TaskResources": None,
        "AllocatedResources": allocated_resources(a), "Services": None,
        "Metrics": msgspec.to_builtins(a.metrics), "DeploymentID": a.deployment_id,
        "PreviousAllocation": a.previous_allocation, "NetworkStatus": None,
        "AllocModifyIndex": a.alloc_modify_index, "SigningKeyID": "",
    })
    return _omit_zero(out)


def evaluation(e: Eval) -> Json:
    return _omit_zero({
        "ID": e.id, "Namespace": e.namespace, "Priority": e.priority, "Type": e.type,
        "TriggeredBy": e.triggered_by, "JobID": e.job_id, "JobModifyIndex": e.job_modify_index,
        "NodeID": e.node_id, "DeploymentID": e.deployment_id, "Status": e.status,
        "StatusDescription": e.status_description, "NextEval": e.next_eval,
        "PreviousEval": e.previous_eval, "BlockedEval": e.blocked_eval,
        "FailedTGAllocs": None if e.failed_tg_allocs is None else {
            k: msgspec.to_builtins(v) for k, v in e.failed_tg_allocs.items()},
        "ClassEligibility": e.class_eligibility, "EscapedComputedClass": e.escaped_computed_class,
        "QueuedAllocations": e.queued_allocations, "SnapshotIndex": e.snapshot_index,
        "CreateIndex": e.create_index, "ModifyIndex": e.modify_index,
        "CreateTime": e.create_time, "ModifyTime": e.modify_time,
    })


def deployment(d: Deployment) -> Json:
    return {
        "ID": d.id, "Namespace": d.namespace, "JobID": d.job_id, "JobVersion": d.job_version,
        "JobModifyIndex": d.job_modify_index, "JobSpecModifyIndex": d.job_spec_modify_index,
        "JobCreateIndex": d.job_create_index, "IsMultiregion": False,
        "TaskGroups": {name: {
            "AutoRevert": g.auto_revert, "AutoPromote": g.auto_promote,
            "ProgressDeadline": g.progress_deadline,
            "RequireProgressBy": rfc3339(g.require_progress_by),
            "Promoted": False, "PlacedCanaries": None, "DesiredCanaries": 0,
            "DesiredTotal": g.desired_total, "PlacedAllocs": g.placed_allocs,
            "HealthyAllocs": g.healthy_allocs, "UnhealthyAllocs": g.unhealthy_allocs,
        } for name, g in d.task_groups.items()},
        "Status": d.status, "StatusDescription": d.status_description, "EvalPriority": 0,
        "CreateIndex": d.create_index, "ModifyIndex": d.modify_index,
        "CreateTime": d.create_time, "ModifyTime": d.modify_time,
    }


def service(s: ServiceReg) -> Json:
    return {"ID": s.id, "ServiceName": s.service_name, "Namespace": s.namespace,
            "NodeID": s.node_id, "Datacenter": s.datacenter, "JobID": s.job_id,
            "AllocID": s.alloc_id, "Tags": s.tags or None, "Address": s.address, "Port": s.port,
            "CreateIndex": s.create_index, "ModifyIndex": s.modify_index}


def check(c: CheckResult) -> Json:
    out: Json = {"ID": c.id, "Check": c.check, "Group": c.group, "Mode": c.mode,
                 "Output": c.output, "Service": c.service, "Status": c.status,
                 "Timestamp": c.timestamp}
    if c.status_code:
        out["StatusCode"] = c.status_code
    if c.task:
        out["Task"] = c.task
    return out


def _node_resources(n: Node) -> Json:
    cores = [{"SocketID": i * n.sockets // max(len(n.core_ids), 1),
              "NodeID": i * n.sockets // max(len(n.core_ids), 1), "ID": i, "Grade": True,
              "Disable": False, "BaseSpeed": n.core_mhz, "MaxSpeed": n.core_mhz + 800,
              "GuessSpeed": 0} for i in n.core_ids]
    return {
        "Cpu": {"CpuShares": len(n.core_ids) * n.core_mhz, "TotalCpuCores": len(n.core_ids),
                "ReservableCpuCores": n.core_ids},
        "Processors": {"Topology": {"Nodes": list(range(n.sockets)), "Distances": None,
                                    "Cores": cores, "OverrideTotalCompute": 0,
                                    "OverrideWitholdCompute": 0}},
        "Memory": {"MemoryMB": n.memory_mb}, "Disk": {"DiskMB": n.disk_mb},
        "Devices": _nil([{
            "Vendor": g.vendor, "Type": g.type, "Name": g.name, "Attributes": g.attributes,
            "Instances": [{"ID": i.id, "Healthy": i.healthy, "HealthDescription": "",
                           "Locality": {"PciBusID": i.pci_bus_id}} for i in g.instances],
        } for g in n.devices]),
        "NodeNetworks": [{"Mode": "host", "Device": "eth0", "MacAddress": "",
                          "Speed": 25000, "Addresses": [{"Family": "ipv4", "Alias": "default",
                                                         "Address": n.address,
                                                         "ReservedPorts": "", "Gateway": ""}]}],
        "Networks": [{"Mode": "host", "Device": "eth0", "CIDR": f"{n.address}/32",
                      "IP": n.address, "MBits": 25000, "DNS": None, "ReservedPorts": None,
                      "DynamicPorts": None, "Hostname": ""}],
        "MinDynamicPort": n.min_dynamic_port, "MaxDynamicPort": n.max_dynamic_port,
    }


def _reserved(n: Node) -> Json:
    return {"Cpu": {"CpuShares": n.reserved_cpu_shares, "ReservedCpuCores": n.reserved_cores},
            "Memory": {"MemoryMB": n.reserved_memory_mb}, "Disk": {"DiskMB": n.reserved_disk_mb},
            "Networks": {"ReservedHostPorts": ""}}


def _drivers(n: Node) -> Json:
    return {d: {"Attributes": {f"driver.{d}": "true"}, "Detected": True, "Healthy": True,
                "HealthDescription": "Healthy", "UpdateTime": rfc3339(n.status_updated_at)}
            for d in n.drivers}


def _host_volumes(n: Node) -> Json | None:
    if not n.host_volumes:
        return None
    return ({name: {"Name": name, "Path": v.path, "ReadOnly": v.read_only, "ID": ""}
                 for name, v in n.host_volumes.items()})


def _drain_strategy(n: Node) -> Json | None:
    if not n.drain:
        return None
    return {"Deadline": 3600 * 1_000_000_000, "IgnoreSystemJobs": False,
            "ForceDeadline": ZERO_TIME, "StartedAt": rfc3339(n.status_updated_at)}


def node_stub(n: Node, *, resources: bool, os: bool) -> Json:
    out: Json = {
        "Address": n.address, "ID": n.id, "Datacenter": n.datacenter, "Name": n.name,
        "NodePool": n.node_pool, "NodeClass": n.node_class,
        "Version": n.attributes.get("nomad.version", ""), "Drain": n.drain,
        "SchedulingEligibility": n.eligibility, "Status": n.status, "StatusDescription": "",
        "Drivers": _drivers(n), "HostVolumes": _host_volumes(n), "LastDrain": None,
        "CreateIndex": n.create_index, "ModifyIndex": n.modify_index,
    }
    if os:
        out["Attributes"] = n.attributes
    if resources:
        out["NodeResources"] = _node_resources(n)
        out["ReservedResources"] = _reserved(n)
    return out


def node(n: Node, computed_class: str) -> Json:
    return {
        "ID": n.id, "SecretID": "", "Datacenter": n.datacenter, "Name": n.name,
        "HTTPAddr": f"{n.address}:4646", "TLSEnabled": False, "Attributes": n.attributes,
        "NodeResources": _node_resources(n), "ReservedResources": _reserved(n),
        "Resources": None, "Reserved": None, "Links": None, "Meta": n.meta,
        "NodeClass": n.node_class, "NodePool": n.node_pool, "CgroupParent": "/nomad",
        "Drain": n.drain, "DrainStrategy": _drain_strategy(n),
        "SchedulingEligibility": n.eligibility, "Status": n.status, "StatusDescription": "",
        "StatusUpdatedAt": n.status_updated_at // 1_000_000_000, "Events": None,
        "Drivers": _drivers(n), "HostVolumes": _host_volumes(n), "GCVolumesOnNodeGC": False,
        "HostNetworks": None, "CSIControllerPlugins": None, "CSINodePlugins": None,
        "LastDrain": None, "ComputedClass": computed_class, "NodeMaxAllocs": 0,
        "IdentitySigningKeyID": "", "LastMissedHeartbeatIndex": 0, "LastAllocUpdateIndex": 0,
        "CreateIndex": n.create_index, "ModifyIndex": n.modify_index,
    }


def alloc_stats(a: Alloc, now_ns: int) -> Json:
    rss = a.memory_usage or 0
    memory = {"RSS": rss, "Cache": 0, "Swap": 0, "MappedFile": 0, "Usage": rss,
              "MaxUsage": rss, "KernelUsage": 0, "KernelMaxUsage": 0,
              "Measured": ["RSS", "Cache", "Swap", "Usage", "Max Usage"]}
    cpu = {"SystemMode": 0.0, "UserMode": 0.0, "TotalTicks": 0.0, "ThrottledPeriods": 0,
           "ThrottledTime": 0, "Percent": 0.0, "Measured": ["Throttled Periods",
                                                           "Throttled Time", "Percent"]}
    usage = {"MemoryStats": memory, "CpuStats": cpu, "DeviceStats": None}
    main = [n for n, t in a.tasks.items() if t.stage in ("main", "sidecar")]
    tasks = {name: {"ResourceUsage": usage if name == (main[0] if main else name) else
                    {"MemoryStats": {**memory, "RSS": 0, "Usage": 0, "MaxUsage": 0},
                     "CpuStats": cpu, "DeviceStats": None},
                    "Timestamp": now_ns, "Pids": None} for name in a.tasks}
    return {"ResourceUsage": usage, "Tasks": tasks, "Timestamp": now_ns}
