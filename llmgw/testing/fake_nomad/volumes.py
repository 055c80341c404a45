"""Host volumes as a client has them: a directory that must exist, with an owner.

Nomad neither creates nor chowns a host volume's path. A client only stats it when it
starts, and refuses to start when it is missing (client/client.go ``setupNode``:
"failed to validate volume …"), so such a node never registers. The Docker driver
bind-mounts the directory as it is, and a task writes there only if the uid it runs as
may: the task's ``user`` (``User``), else its image's own ``USER`` (``FakeNomad``'s
``image_users``; root when not given), checked against the directory's owner and mode
the way the kernel checks them (root may write anything; the owner needs ``u+w``;
others ``o+w``; groups are not modelled).

A task that cannot write where it must exits 1 at once, as ``llmgw fetch`` does: the
fake fails it and its allocation (``lifecycle.fail_at_start``).
"""

from __future__ import annotations

from typing import Any

from llmgw.testing.fake_nomad.records import Alloc, Node

Json = dict[str, Any]


def missing(node: Node) -> str | None:
    """Why the node's client would not start, if a host volume's path does not exist."""
    for name, vol in sorted(node.host_volumes.items()):
        if not vol.exists:
            return (f"failed to validate volume {name}, err: stat {vol.path}: no such file "
                    "or directory")
    return None


def uid_of(task: Json, image_users: dict[str, int]) -> int:
    """The uid a Docker task runs as: ``User`` (``uid`` or ``uid:gid``; ``root``), else its
    image's ``USER``."""
    user = str(task.get("User") or "")
    if not user:
        return image_users.get(str((task.get("Config") or {}).get("image", "")), 0)
    first = user.split(":", 1)[0]
    if first == "root":
        return 0
    return int(first) if first.isdigit() else -1   # a name: no uid the fake can resolve


def can_write(uid: int, owner: int, mode: int) -> bool:
    return uid == 0 or (uid == owner and bool(mode & 0o200)) or bool(mode & 0o002)


def refusal(a: Alloc, node: Node, task: str, image_users: dict[str, int]) -> str | None:
    """Why ``task`` of ``a`` cannot write a host volume it mounts writable, or None."""
    group = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
    spec = next((t for t in group.get("Tasks", []) if t["Name"] == task), None)
    if spec is None or spec.get("Driver") != "docker":
        return None
    uid = uid_of(spec, image_users)
    volumes = group.get("Volumes") or {}
    for vm in spec.get("VolumeMounts") or []:
        vol = volumes.get(vm.get("Volume", "")) or {}
        host = node.host_volumes.get(vol.get("Source", "")) if vol.get("Type") == "host" \
            else None
        if host is None or vm.get("ReadOnly") or vol.get("ReadOnly"):
            continue
        if not can_write(uid, host.owner, host.mode):
            return (f"cannot write {vm.get('Destination', '')}: Permission denied "
                    f"({host.path} on {node.name} is owned by uid {host.owner}, mode "
                    f"{host.mode:04o}; the task runs as uid {uid})")
    return None
