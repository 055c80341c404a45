"""GPUs: matching a device request to a node's device groups, and picking instances.

Names match exactly and case-sensitively on vendor/type/model (docs/nomad-api.md §2,
``RequestedDevice.ID().Matches``); device constraints and affinities compare typed
attributes with units (``attributes.check_attribute``). Feasibility counts healthy
instances and ignores usage ("missing devices"); the offer at ranking time takes only
free instances ("devices: no devices match request" when there are not enough).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

from typing import Any

from llmgw.testing.fake_nomad.attributes import (
    Attr,
    attr_from_wire,
    check_attribute,
    parse_attribute,
)
from llmgw.testing.fake_nomad.records import AllocDevice, DeviceGroup, Node

Json = dict[str, Any]


def _target(target: str, group: DeviceGroup) -> Any:
    if not target.startswith("${"):
        return parse_attribute(target)
    simple = {"${device.model}": group.name, "${device.vendor}": group.vendor,
              "${device.type}": group.type,
              "${device.ids}": ",".join(i.id for i in group.instances)}
    if target in simple:
        return Attr("string", simple[target])
    if target.startswith("${device.attr."):
        wire = group.attributes.get(target[len("${device.attr."):].rstrip("}"))
        return attr_from_wire(wire) if wire is not None else None
    return None


def device_matches(group: DeviceGroup, request: Json) -> bool:
    """RequestedDevice.ID().Matches + nodeDeviceMatches (§2: exact, case-sensitive)."""
    parts = request.get("Name", "").split("/", 2)
    want = {1: ("", parts[0], ""), 2: (parts[0], parts[-1], ""),
            3: tuple(parts)}[len(parts)]
    vendor, dtype, name = want
    if dtype != group.type or (vendor and vendor != group.vendor) or (name and name != group.name):
        return False
    return all(check_attribute(c.get("Operand", ""), _target(c.get("LTarget", ""), group),
                               _target(c.get("RTarget", ""), group))
               for c in request.get("Constraints", []))


def has_devices(node: Node, tasks: list[Json]) -> bool:
    """DeviceChecker.hasDevices: enough healthy matching instances, usage ignored."""
    available = {id(g): sum(i.healthy for i in g.instances) for g in node.devices}
    for task in tasks:
        for req in task["Resources"].get("Devices", []):
            need = int(req.get("Count", 1))
            for g in node.devices:
                if need and available[id(g)] and device_matches(g, req):
                    take = min(need, available[id(g)])
                    available[id(g)] -= take
                    need -= take
            if need:
                return False
    return True


def offer(node: Node, req: Json, taken: set[str]) -> AllocDevice | None:
    """DeviceAllocator.createOffer: one matching group with Count free healthy instances."""
    best: tuple[float, AllocDevice] | None = None
    for g in node.devices:
        if not device_matches(g, req):
            continue
        free = [i.id for i in g.instances if i.healthy and i.id not in taken]
        if len(free) < int(req.get("Count", 1)):
            continue
        weights = list(req.get("Affinities", []))
        total = sum(abs(a.get("Weight", 50)) for a in weights) or 1
        score = sum(a.get("Weight", 50) for a in weights if check_attribute(
            a.get("Operand", ""), _target(a.get("LTarget", ""), g),
            _target(a.get("RTarget", ""), g))) / total
        offer = AllocDevice(vendor=g.vendor, type=g.type, name=g.name,
                            device_ids=free[: int(req.get("Count", 1))])
        if best is None or score > best[0]:
            best = (score, offer)
    return best[1] if best else None
