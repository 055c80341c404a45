"""Placing one allocation of a task group, as Nomad's generic scheduler does.

A pure function over nodes and the allocations already on them; no I/O, no clock.
It walks the same stages as scheduler/feasible's GenericStack, in the same order,
because the *first* stage that rejects a node is the one recorded in the
``AllocationMetric`` a client reads back (docs/nomad-api.md §5.2):

feasibility (``ConstraintFiltered``, a node that could never run the group):
  job constraints → drivers ("missing drivers") → group and task constraints
  (``"<LTarget> <Operand> <RTarget>"``) → devices by name, healthy count and device
  constraints ("missing devices", §2) → host volumes ("missing compatible host volumes").
  Results are cached per *computed class* for the evaluation, so a second node identical
  to a rejected one is filtered as "computed class ineligible" — as in Nomad.

then ``distinct_hosts`` (a node already running the job's group, or the job when the
constraint is at job level: ``ConstraintFiltered["distinct_hosts"]``, never cached);

ranking (``DimensionExhausted``, a node that could run it but is full now):
  ports ("network: port collision") → per task: devices ("devices: no devices match
  request" when the matching GPUs are all taken) → cores ("cores") → AllocsFit over
  CPU MHz ("cpu"), memory ("memory"), disk ("disk"). The node's score averages
  bin-packing, job anti-affinity, node affinities and spreads (``allocation-spread``:
  with no targets, scheduler/feasible/spread.go ``evenSpreadScoreBoost`` gives an
  unused value +1 and a value already as used as the least used one −1).

Capacity follows §3.3: node resources minus reserved minus the comparable resources of
every allocation that is not client-terminal (an alloc told to stop but still running
counts). ``Cores`` take the lowest free usable core IDs and charge their MHz to
``CpuShares``. Nodes are tried in the order given — not randomised as Nomad does — so
tests are deterministic; the best-scoring node wins (bin-packing, job anti-affinity,
node affinities).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from llmgw.testing.fake_nomad import devices as gpu
from llmgw.testing.fake_nomad.attributes import check_strings
from llmgw.testing.fake_nomad.records import (
    Alloc,
    AllocMetric,
    Node,
    PortMapping,
    TaskAlloc,
)

Json = dict[str, Any]


@dataclass
class Usage:
    """What the non-terminal allocations on one node hold (§3.3)."""

    cpu_shares: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    cores: set[int] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    groups: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def add(self, alloc: Alloc) -> None:
        self.add_parts(alloc.tasks, alloc.disk_mb, alloc.ports,
                       (alloc.namespace, alloc.job_id, alloc.task_group))

    def remove(self, alloc: Alloc) -> None:
        self.add_parts(alloc.tasks, alloc.disk_mb, alloc.ports,
                       (alloc.namespace, alloc.job_id, alloc.task_group), sign=-1)

    def add_parts(self, tasks: dict[str, TaskAlloc], disk_mb: int, ports: list[PortMapping],
                  group: tuple[str, str, str], sign: int = 1) -> None:
        shares, cores, memory = comparable(tasks)
        self.cpu_shares += sign * shares
        self.memory_mb += sign * memory
        self.disk_mb += sign * disk_mb
        devices = {i for t in tasks.values() for d in t.devices for i in d.device_ids}
        if sign > 0:
            self.cores |= cores
            self.devices |= devices
            self.ports.update(p.value for p in ports)
        else:
            self.cores -= cores
            self.devices -= devices
            self.ports.difference_update(p.value for p in ports)
        self.groups[group] = self.groups.get(group, 0) + sign


@dataclass
class Placement:
    node: Node
    tasks: dict[str, TaskAlloc]
    disk_mb: int
    ports: list[PortMapping]
    metric: AllocMetric


@dataclass
class Eligibility:
    """EvalContext eligibility: per computed class, for the job and for each group."""

    job: dict[str, bool] = field(default_factory=dict)
    groups: dict[tuple[str, str], bool] = field(default_factory=dict)


def comparable(tasks: dict[str, TaskAlloc]) -> tuple[int, set[int], int]:
    """AllocatedResources.Comparable (structs.go l.3785): lifecycle stages combine by max."""
    shares, cores = 0, set()
    main, pre, stop = [0, 0], [0, 0], [0, 0]
    for t in tasks.values():
        cpu = t.cpu_shares
        if t.reserved_cores:  # core-pinned CPU counts in full whatever the stage
            shares += t.cpu_shares
            cores.update(t.reserved_cores)
            cpu = 0
        buckets = {"main": [main], "poststart": [main], "prestart": [pre],
                   "sidecar": [pre, main], "poststop": [stop]}[t.stage]
        for b in buckets:
            b[0] += cpu
            b[1] += t.memory_mb
    return (shares + max(main[0], pre[0], stop[0]), cores, max(main[1], pre[1], stop[1]))


def usage_by_node(allocs: list[Alloc]) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for a in allocs:
        if not a.client_terminal:
            out.setdefault(a.node_id, Usage()).add(a)
    return out


def computed_class(node: Node) -> str:
    """Node.ComputeClass: datacenter, class, pool, non-unique attributes/meta, devices."""
    payload = {
        "dc": node.datacenter, "class": node.node_class, "pool": node.node_pool,
        "attr": {k: v for k, v in node.attributes.items() if not k.startswith("unique.")},
        "meta": {k: v for k, v in node.meta.items() if not k.startswith("unique.")},
        "dev": [(d.vendor, d.type, d.name, d.attributes) for d in node.devices],
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).digest()
    return f"v1:{int.from_bytes(digest[:8], 'big')}"


def stage(task: Json) -> str:
    lc = task.get("Lifecycle") or {}
    hook = lc.get("Hook", "")
    if hook == "prestart":
        return "sidecar" if lc.get("Sidecar") else "prestart"
    return hook if hook in ("poststart", "poststop") else "main"


def resolve(target: str, node: Node) -> str | None:
    """ResolveTarget (feasible.go l.1096); None when the attribute is not set."""
    if not target.startswith("${"):
        return target
    exact = {"${node.unique.id}": node.id, "${node.datacenter}": node.datacenter,
             "${node.unique.name}": node.name, "${node.class}": node.node_class,
             "${node.pool}": node.node_pool}
    if target in exact:
        return exact[target]
    inner = target[2:].rstrip("}")
    if inner.startswith("attr."):
        return node.attributes.get(inner[5:])
    if inner.startswith("meta."):
        return node.meta.get(inner[5:])
    return None


def constraint_text(c: Json) -> str:
    return f"{c.get('LTarget', '')} {c.get('Operand', '')} {c.get('RTarget', '')}"


def meets(c: Json, node: Node) -> bool:
    return check_strings(c.get("Operand", ""), resolve(c.get("LTarget", ""), node),
                         resolve(c.get("RTarget", ""), node))








def _escapes(constraints: list[Json]) -> bool:
    prefixes = ("${unique.", "${node.unique.", "${attr.unique.", "${meta.unique.")
    return any(str(c.get(k, "")).startswith(prefixes) for c in constraints
               for k in ("LTarget", "RTarget"))


def _feasible(job: Json, tg: Json, node: Node, metric: AllocMetric, elig: Eligibility) -> bool:
    """FeasibilityWrapper.Next for one node (feasible.go l.1450)."""
    cls = computed_class(node)
    job_constraints = job.get("Constraints", [])
    if not _escapes(job_constraints) and elig.job.get(cls) is False:
        metric.filter_node(node, "computed class ineligible")
        return False
    if elig.job.get(cls) is None or _escapes(job_constraints):
        for c in job_constraints:
            if not meets(c, node):
                metric.filter_node(node, constraint_text(c))
                if not _escapes(job_constraints):
                    elig.job[cls] = False
                return False
        if not _escapes(job_constraints):
            elig.job[cls] = True
    tasks = tg.get("Tasks", [])
    tg_constraints = list(tg.get("Constraints", []))
    for t in tasks:
        tg_constraints += t.get("Constraints", [])
    escaped = _escapes(tg_constraints)
    known = elig.groups.get((tg["Name"], cls))
    if known is False and not escaped:
        metric.filter_node(node, "computed class ineligible")
        return False
    if known is None or escaped:
        reason = None
        if any(t.get("Driver") not in node.drivers for t in tasks):
            reason = "missing drivers"
        else:
            reason = next((constraint_text(c) for c in tg_constraints if not meets(c, node)),
                          None)
        if reason is None and not gpu.has_devices(node, tasks):
            reason = "missing devices"
        if reason is not None:
            metric.filter_node(node, reason)
            if not escaped:
                elig.groups[(tg["Name"], cls)] = False
            return False
        if not escaped:
            elig.groups[(tg["Name"], cls)] = True
    for vol in (tg.get("Volumes") or {}).values():
        host = node.host_volumes.get(vol.get("Source", "")) if vol.get("Type") == "host" else None
        if vol.get("Type") == "host" and (host is None or (host.read_only and
                                                          not vol.get("ReadOnly"))):
            metric.filter_node(node, "missing compatible host volumes")
            return False
    return True


def _ports(tg: Json, node: Node, used: set[int]) -> list[PortMapping] | None:
    """Reserved ports as asked; dynamic ones take the lowest free port of the node's range
    (Nomad picks at random within it — clients must read the port, never predict it)."""
    out: list[PortMapping] = []
    taken = set(used)
    for net in tg.get("Networks", []):
        for p in net.get("ReservedPorts", []):
            if p.get("Value", 0) in taken:
                return None
            taken.add(p["Value"])
            out.append(PortMapping(label=p.get("Label", ""), value=p["Value"],
                                   to=p.get("To", 0), host_ip=node.address))
        for p in net.get("DynamicPorts", []):
            port = next((v for v in range(node.min_dynamic_port, node.max_dynamic_port + 1)
                         if v not in taken), None)
            if port is None:
                return None
            taken.add(port)
            to = p.get("To", 0)
            out.append(PortMapping(label=p.get("Label", ""), value=port,
                                   to=port if to in (0, -1) else to, host_ip=node.address))
    return out




def _rank(job: Json, tg: Json, node: Node, usage: Usage, metric: AllocMetric
          ) -> tuple[dict[str, TaskAlloc], list[PortMapping], float] | None:
    """BinPackIterator.Next for one node (rank.go); None when the node is exhausted."""
    ports = _ports(tg, node, usage.ports)
    if ports is None:
        metric.exhaust_node(node, "network: port collision")
        return None
    usable = set(node.core_ids) - set(node.reserved_cores)
    cores_taken = set(usage.cores)
    dev_taken = set(usage.devices)
    tasks: dict[str, TaskAlloc] = {}
    for task in tg.get("Tasks", []):
        res = task["Resources"]
        devices = []
        for req in res.get("Devices", []):
            offer = gpu.offer(node, req, dev_taken)
            if offer is None:
                metric.exhaust_node(node, "devices: no devices match request")
                return None
            dev_taken.update(offer.device_ids)
            devices.append(offer)
        want = int(res.get("Cores", 0))
        chosen: list[int] = []
        if want:
            free = sorted(usable - cores_taken)
            if len(free) < want:
                metric.exhaust_node(node, "cores")
                return None
            chosen = free[:want]
            cores_taken.update(chosen)
        tasks[task["Name"]] = TaskAlloc(
            cpu_shares=len(chosen) * node.core_mhz if want else int(res.get("CPU", 0)),
            reserved_cores=chosen, memory_mb=int(res.get("MemoryMB", 0)),
            memory_max_mb=int(res.get("MemoryMaxMB", 0)), devices=devices, stage=stage(task))
    shares, _, memory = comparable(tasks)
    disk = int(tg["EphemeralDisk"]["SizeMB"])
    total_cpu = len(node.core_ids) * node.core_mhz - node.reserved_cpu_shares
    total_mem = node.memory_mb - node.reserved_memory_mb
    for dim, used, have in (("cpu", usage.cpu_shares + shares, total_cpu),
                            ("memory", usage.memory_mb + memory, total_mem),
                            ("disk", usage.disk_mb + disk, node.disk_mb - node.reserved_disk_mb)):
        if used > have:
            metric.exhaust_node(node, dim)
            return None
    free_cpu = 1 - (usage.cpu_shares + shares) / max(total_cpu, 1)
    free_mem = 1 - (usage.memory_mb + memory) / max(total_mem, 1)
    binpack = (20 - (10**free_cpu + 10**free_mem)) / 18  # rank.go ScoreFitBinPack
    return tasks, ports, binpack


def _distinct(constraints: list[Json]) -> bool:
    """hasDistinctHostsConstraint: present, with RTarget empty or a true bool."""
    for c in constraints:
        if c.get("Operand") == "distinct_hosts":
            value = c.get("RTarget", "")
            return value == "" or value.lower() not in ("0", "f", "false")
    return False


def _distinct_hosts(job: Json, tg: Json, used: Usage) -> bool:
    """DistinctHostsIterator (feasible.go): after the class-cached checks, per node."""
    ns, jid = job.get("Namespace", "default"), job["ID"]
    if _distinct(job.get("Constraints", [])):
        return not any(k[:2] == (ns, jid) and n > 0 for k, n in used.groups.items())
    if _distinct(tg.get("Constraints", [])):
        return used.groups.get((ns, jid, tg["Name"]), 0) <= 0
    return True


def _even_spread(used: dict[str, int], value: str | None) -> float:
    """evenSpreadScoreBoost (spread.go): favour the least used values of the attribute."""
    if not used:
        return 0.0
    if value is None:
        return -1.0
    current, low, high = used.get(value, 0), min(used.values()), max(used.values())
    if current != low:
        return (low - current) / low if low else -1.0
    if low == high:
        return -1.0
    return (high - low) / low


def _spread(job: Json, tg: Json, node: Node, nodes: list[Node],
            usage: dict[str, Usage]) -> float:
    """SpreadIterator.Next: the summed boost of the group's and the job's spreads."""
    spreads = list(tg.get("Spreads", [])) + list(job.get("Spreads", []))
    if not spreads:
        return 0.0
    key = (job.get("Namespace", "default"), job["ID"], tg["Name"])
    weights = sum(sp.get("Weight", 50) for sp in spreads) or 1
    total = 0.0
    for sp in spreads:
        attribute = sp["Attribute"]
        used: dict[str, int] = {}
        for n in nodes:
            count = usage[n.id].groups.get(key, 0) if n.id in usage else 0
            value = resolve(attribute, n)
            if count > 0 and value is not None:
                used[value] = used.get(value, 0) + count
        value = resolve(attribute, node)
        targets = sp.get("SpreadTarget", [])
        if not targets:
            total += _even_spread(used, value)
            continue
        group_count = int(tg.get("Count", 1))
        desired = {t["Value"]: t.get("Percent", 0) / 100 * group_count for t in targets}
        if 0 < sum(desired.values()) < group_count:
            desired["*"] = group_count - sum(desired.values())
        want = desired.get(value or "", desired.get("*"))
        if want is None:
            total -= 1.0
        elif want == 0:
            total -= 1.0  # lowestSpreadBoost starts at -1
        else:
            have = used.get(value or "", 0) + 1
            total += (want - have) / want * sp.get("Weight", 50) / weights
    return total


def place(job: Json, tg: Json, nodes: list[Node], usage: dict[str, Usage],
          elig: Eligibility) -> Placement | AllocMetric:
    """Find the best node for one more allocation of ``tg``; the metric explains a miss."""
    metric = AllocMetric(node_pool=job.get("NodePool", "default"))
    dcs = job.get("Datacenters") or ["*"]
    candidates = [n for n in nodes if n.schedulable and (job.get("NodePool") in ("all", "")
                  or n.node_pool == job.get("NodePool"))
                  and any(fnmatch.fnmatchcase(n.datacenter, dc) for dc in dcs)]
    metric.nodes_in_pool = len(candidates)
    metric.nodes_available = {}
    for n in candidates:
        metric.nodes_available[n.datacenter] = metric.nodes_available.get(n.datacenter, 0) + 1
    count = max(int(tg.get("Count", 1)), 1)
    affinities = list(job.get("Affinities", [])) + list(tg.get("Affinities", []))
    for t in tg.get("Tasks", []):
        affinities += t.get("Affinities", [])
    best: tuple[float, Node, dict[str, TaskAlloc], list[PortMapping]] | None = None
    scored: list[Json] = []
    for node in candidates:
        metric.nodes_evaluated += 1
        if not _feasible(job, tg, node, metric, elig):
            continue
        if not _distinct_hosts(job, tg, usage.get(node.id, Usage())):
            metric.filter_node(node, "distinct_hosts")
            continue
        ranked = _rank(job, tg, node, usage.get(node.id, Usage()), metric)
        if ranked is None:
            continue
        tasks, ports, binpack = ranked
        scores = {"binpack": binpack}
        collisions = usage.get(node.id, Usage()).groups.get(
            (job.get("Namespace", "default"), job["ID"], tg["Name"]), 0)
        if collisions:
            scores["job-anti-affinity"] = -(collisions + 1) / count
        if affinities:
            total = sum(abs(a.get("Weight", 50)) for a in affinities) or 1
            scores["node-affinity"] = sum(a.get("Weight", 50) for a in affinities
                                          if meets(a, node)) / total
        spread = _spread(job, tg, node, nodes, usage)
        if spread:
            scores["allocation-spread"] = spread
        final = sum(scores.values()) / len(scores)
        scored.append({"NodeID": node.id, "Scores": scores, "NormScore": final})
        if best is None or final > best[0]:
            best = (final, node, tasks, ports)
    if best is None:
        return metric
    metric.score_meta_data = sorted(scored, key=lambda s: -s["NormScore"])[:5]
    _, node, tasks, ports = best
    return Placement(node=node, tasks=tasks, disk_mb=int(tg["EphemeralDisk"]["SizeMB"]),
                     ports=ports, metric=metric)
