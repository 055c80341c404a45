"""``llmgw nomad doctor``: what a cluster lacks before its first model, decided without I/O.

The command (``llmgw.cli.nomad``) reads — never writes — what llmgw needs of a cluster
and hands it here as a ``Seen``; ``diagnose`` returns one ``Line`` per thing checked,
present or missing, each missing one with its fix. The exit status is 0 only when no
line is ``missing``: a ``warn`` is something llmgw runs without, with less (a token
that may not write node metadata: no warm-node placement), an ``info`` what cannot be
checked from here.

What is checked, and against what:

* the token (``/v1/acl/token/self``) and each of its policies' ``RulesJSON``
  (``/v1/acl/policy/:name``), against every grant ``access.requirements`` lists —
  the endpoints llmgw calls, the host volume its jobs mount, the Variables its tasks
  read, node metadata. With ACLs off Nomad answers the ``acls-disabled`` token and
  allows everything (nomad/acl_endpoint.go ``WhoAmI``); a management token likewise;
  a token's roles are not resolved, so a grant they might hold reads as missing;
* each ready client node's ``HostVolumes`` (the cache volume, writable), and its
  Docker driver (``Drivers``: detected and healthy). Nomad's API shows a volume's path
  and ``read_only`` but **not the directory's owner or mode**, which decide whether the
  fetch's uid can write it: doctor says so and how to look on the node;
* every ``gpu_classes`` entry: some node's NVIDIA device plugin reports a device of that
  exact name (the NVML string) with at least that memory — the constraint every job of
  that class carries — and no node that carries ``llmgw_gpu_class`` lacks the plugin;
* the Prometheus service-discovery token, when given: ``read-job`` in llmgw's namespace
  (deploy/prometheus-policy.hcl).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from llmgw.catalog.model import GpuClass
from llmgw.config import NomadConfig
from llmgw.scheduler.nomad import access, wire
from llmgw.scheduler.nomad.fleet import GPU_CLASS_META

Status = Literal["ok", "missing", "warn", "info"]
MIB = 1024 * 1024
POLICY_FILE = "nomad/llmgw-policy.hcl"
PROMETHEUS_POLICY = "deploy/prometheus-policy.hcl"


class Line(msgspec.Struct, frozen=True, kw_only=True):
    status: Status
    what: str
    fix: str = ""

    @property
    def text(self) -> str:
        return f"{self.status:<8}{self.what}" + (f"\n        fix: {self.fix}" if self.fix else "")


class TokenSeen(msgspec.Struct, frozen=True, kw_only=True):
    """A token as Nomad described it, with the rules of the policies it could read."""

    token: wire.AclToken | None = None
    error: str = ""                         # why token/self failed
    policies: list[wire.PolicyRules] = []
    unreadable: dict[str, str] = {}         # policy → why it could not be read


class Seen(msgspec.Struct, frozen=True, kw_only=True):
    """Everything doctor read of the cluster."""

    address: str
    reachable: bool
    error: str = ""                         # why Nomad could not be reached
    llmgw: TokenSeen = TokenSeen()
    nodes: list[wire.Node] = []
    nodes_error: str = ""
    prometheus: TokenSeen | None = None     # None: no token given


def _token_lines(seen: TokenSeen, who: str, grants: Sequence[access.Grant],
                 policy_file: str) -> list[Line]:
    if seen.token is None:
        return [Line(status="missing", what=f"{who}: Nomad cannot say who it is: {seen.error}",
                     fix=f"create a token with the policy in {policy_file} and configure it")]
    t = seen.token
    if t.AccessorID == "acls-disabled":
        return [Line(status="warn", what=f"{who}: ACLs are off, so Nomad allows every call",
                     fix="enable ACLs on the servers (nomad/server.hcl `acl { enabled = "
                         f"true }}`) and give llmgw a token with {policy_file}")]
    if t.Type == "management":
        return [Line(status="ok", what=f"{who}: management token {t.Name!r} ({t.AccessorID}): "
                     "every capability (a token with only "
                     f"{policy_file} holds less)")]
    out = [Line(status="ok", what=f"{who}: token {t.Name!r} ({t.AccessorID}), policies "
                f"{', '.join(t.Policies or []) or '(none)'}")]
    for name, why in sorted(seen.unreadable.items()):
        out.append(Line(status="warn", what=f"{who}: cannot read policy {name!r}: {why}"))
    if t.Roles:
        out.append(Line(status="info", what=f"{who}: the token's roles are not read; a grant "
                        "only a role holds shows as missing below"))
    granted = access.Granted(seen.policies)
    for g in grants:
        if granted.allows(g):
            out.append(Line(status="ok", what=f"{who}: {g.text} — {g.why}"))
        else:
            out.append(Line(status="warn" if g.optional else "missing",
                            what=f"{who}: no {g.text} — needed to {g.why}",
                            fix=f"add `{g.fix}` to the token's policy ({policy_file} has it), "
                                "then `nomad acl policy apply`"))
    return out


def _bytes(attr: wire.Attribute | None) -> int | None:
    units = {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": 1024 * MIB, "kB": 1000, "MB": 1000**2,
             "GB": 1000**3}
    if attr is None or attr.Int is None or attr.Unit not in units:
        return None
    return attr.Int * units[attr.Unit]


def _gpus(node: wire.Node) -> list[wire.NodeDeviceResource]:
    devices = (node.NodeResources.Devices if node.NodeResources else None) or []
    return [d for d in devices if d.Type == "gpu"]


def _node_lines(seen: Seen, cfg: NomadConfig) -> list[Line]:
    ready = [n for n in seen.nodes if n.Status == "ready"]
    if not ready:
        return [Line(status="missing", what="no client node is ready",
                     fix="start a client with nomad/client-gpu.hcl or nomad/client-cpu.hcl")]
    out = []
    volume = cfg.cache_volume
    for n in sorted(ready, key=lambda n: n.Name):
        vol = (n.HostVolumes or {}).get(volume)
        if vol is None:
            out.append(Line(status="missing", what=f"node {n.Name}: no host volume {volume!r}",
                            fix="add the host_volume block of nomad/client-gpu.hcl to its "
                                "client configuration and restart the agent"))
        elif vol.ReadOnly:
            out.append(Line(status="missing",
                            what=f"node {n.Name}: host volume {volume!r} is read-only",
                            fix="set read_only = false in its host_volume block"))
        else:
            out.append(Line(status="ok", what=f"node {n.Name}: host volume {volume!r} at "
                            f"{vol.Path}, writable"))
        docker = (n.Drivers or {}).get("docker")
        if docker is None or not docker.Detected:
            out.append(Line(status="missing", what=f"node {n.Name}: no Docker driver",
                            fix="install Docker on the node and restart the Nomad agent"))
        elif not docker.Healthy:
            out.append(Line(status="missing", what=f"node {n.Name}: Docker driver unhealthy "
                            f"({docker.HealthDescription})",
                            fix="check the Docker daemon on the node"))
        if (n.Meta or {}).get(GPU_CLASS_META) and not any(
                d.Vendor == "nvidia" for d in _gpus(n)):
            out.append(Line(status="missing",
                            what=f"node {n.Name}: carries {GPU_CLASS_META} but reports no "
                                 "nvidia GPU", fix="install the nomad-device-nvidia plugin in "
                                 "its plugin_dir with its plugin block (nomad/client-gpu.hcl)"))
    paths = sorted({v.Path for n in ready for k, v in (n.HostVolumes or {}).items()
                    if k == volume})
    out.append(Line(status="info", what=f"the owner of {', '.join(paths) or 'the cache path'} "
                    "is not something Nomad's API shows: the fetch runs as uid "
                    f"{cfg.fetch_user} (scheduler.nomad.fetch_user) and must own it",
                    fix="on each node: `stat -c '%u %a' PATH` shows that uid; else `sudo "
                        f"chown -R {cfg.fetch_user} PATH`"))
    return out


def _gpu_lines(seen: Seen, classes: Mapping[str, GpuClass]) -> list[Line]:
    out = []
    groups = [(n, d) for n in seen.nodes if n.Status == "ready" for d in _gpus(n)]
    for name, gc in sorted(classes.items()):
        same = [(n, d) for n, d in groups if d.Name == gc.device and d.Vendor == gc.vendor]
        if not same:
            reported = sorted({d.Name for _, d in groups}) or ["none"]
            out.append(Line(status="missing",
                            what=f"gpu class {name}: no node reports {gc.vendor} device "
                                 f"{gc.device!r} (nodes report: {', '.join(reported)})",
                            fix="copy the device name `nomad node status -verbose` shows "
                                "into gpu_classes exactly, or start a node with that card"))
            continue
        want = int(gc.memory)
        fits = [n.Name for n, d in same if (_bytes((d.Attributes or {}).get("memory")) or 0)
                >= want]
        if fits:
            out.append(Line(status="ok", what=f"gpu class {name}: {gc.device!r} with "
                            f"{want // MIB} MiB or more on {', '.join(sorted(fits))}"))
        else:
            have = sorted({(_bytes((d.Attributes or {}).get("memory")) or 0) // MIB
                           for _, d in same})
            out.append(Line(status="missing",
                            what=f"gpu class {name}: declares {want // MIB} MiB per card but "
                                 f"the nodes report {', '.join(map(str, have))} MiB",
                            fix=f"set its memory to {have[-1]}MiB, what the card reports"))
    return out


def diagnose(seen: Seen, cfg: NomadConfig, classes: Mapping[str, GpuClass]) -> list[Line]:
    """Every line doctor prints, in order."""
    if not seen.reachable:
        return [Line(status="missing", what=f"Nomad at {seen.address}: {seen.error}",
                     fix="check scheduler.nomad.address (or NOMAD_ADDR), TLS and the agent")]
    out = [Line(status="ok", what=f"Nomad at {seen.address} answers")]
    grants = access.requirements(cfg.namespace, cfg.cache_volume)
    out += _token_lines(seen.llmgw, "llmgw's token", grants, POLICY_FILE)
    if seen.nodes_error:
        out.append(Line(status="missing", what=f"cannot read the nodes: {seen.nodes_error}",
                        fix="the token needs node:read"))
    else:
        out += _node_lines(seen, cfg)
        out += _gpu_lines(seen, classes)
    if seen.prometheus is None:
        out.append(Line(status="info", what="the Prometheus token was not checked",
                        fix="pass --prometheus-token (or PROMETHEUS_NOMAD_TOKEN)"))
    else:
        sd = [access.Grant(kind="namespace", target=cfg.namespace or "default",
                           any_of=("read-job",),
                           why="list and read services for nomad_sd_configs")]
        out += _token_lines(seen.prometheus, "Prometheus's token", sd, PROMETHEUS_POLICY)
    return out


def exit_code(lines: Sequence[Line]) -> int:
    """0 only when nothing needed is missing."""
    return 1 if any(line.status == "missing" for line in lines) else 0
