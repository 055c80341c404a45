"""What llmgw's Nomad token must be allowed, call by call, and what a policy grants (pure).

Two readers share this table. The client turns a 403 into an error that names what the
refused call needs (``needed_for``); ``llmgw nomad doctor`` checks every entry of
``requirements`` against the policies the token carries, read from
``/v1/acl/policy/:name`` (``granted``). The table is the one place that says what each
endpoint requires, each entry read from the Nomad handler that checks it:

* jobs (nomad/job_endpoint.go): ``Register``/``doRegister`` submit-job or register-job,
  and for every host volume a group mounts writable ``mount-readwrite`` on that volume
  (acl/acl.go ``AllowHostVolumeOperation``), which no namespace capability implies;
  ``Plan`` submit-job or plan-job; ``Validate``, ``GetJob``, ``Allocations``,
  ``Evaluations``: read-job; ``List``: list-jobs; ``Scale``: scale-job or submit-job;
  ``ScaleStatus``: read-job or read-job-scaling; ``Deregister``: submit-job,
  deregister-job or purge-job;
* nodes (nomad/node_endpoint.go): node read; dynamic metadata
  (nomad/client_meta_endpoint.go ``NodeMeta.Apply``): node write;
* an allocation's files (command/agent/fs_endpoint.go, ``cat/``): read-fs;
* services, deployments, allocation checks and stats: read-job;
* Variables (nomad/variables_endpoint.go ``hasOperationPermissions``): read and write
  on the path.

Matching follows acl/acl.go: a namespace or host volume named exactly wins over every
glob, else the glob closest in length (``findClosestMatchingGlob``); ``deny`` clears a
set; a variables path is looked up exactly, then by the closest glob
(``matchingVariablesCapabilitySet``); node levels are ordered deny < read < write.
``RulesJSON`` is the server's own parse of a policy (nomad/acl_endpoint.go
``GetPolicy`` → acl/policy.go ``Parse``), so a shorthand ``policy = "write"`` arrives
already expanded into its capabilities and llmgw never parses HCL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from llmgw.scheduler.nomad.adapterjob import ADAPTER_PREFIX
from llmgw.scheduler.nomad.render import JOB_PREFIX
from llmgw.scheduler.nomad.warmth import PREFETCH_PREFIX
from llmgw.scheduler.nomad.wire import PolicyRules

Kind = Literal["namespace", "host_volume", "node", "variables"]


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """One capability llmgw's token must hold (any of ``any_of``) on one target."""

    kind: Kind
    target: str                 # namespace, volume name, "" (node) or a variables path
    any_of: tuple[str, ...]
    namespace: str = ""         # a variables path's namespace
    why: str = ""               # what llmgw does with it
    optional: bool = False      # llmgw runs without it, with less (why says what)

    @property
    def text(self) -> str:
        caps = " or ".join(self.any_of)
        if self.kind == "namespace":
            where = ("every namespace" if self.target == "*"
                     else f"namespace {self.target!r}")
            return f"{caps} in {where}"
        if self.kind == "host_volume":
            return f"{caps} on host volume {self.target!r}"
        if self.kind == "node":
            return f"node:{caps}"
        return f"variables {caps} on {self.target} in namespace {self.namespace!r}"

    @property
    def fix(self) -> str:
        """The policy stanza that grants it."""
        first = self.any_of[0]
        if self.kind == "namespace":
            return f'namespace "{self.target}" {{ capabilities = ["{first}"] }}'
        if self.kind == "host_volume":
            return f'host_volume "{self.target}" {{ capabilities = ["{first}"] }}'
        if self.kind == "node":
            return f'node {{ policy = "{first}" }}'
        return (f'namespace "{self.namespace}" {{ variables {{ path "{self.target}" '
                f'{{ capabilities = ["{first}"] }} }} }}')


def variables_glob(job_prefix: str) -> str:
    return f"nomad/jobs/{job_prefix}*"


def requirements(namespace: str, cache_volume: str) -> list[Grant]:
    """Every grant llmgw's token needs, in the order doctor reports them."""
    ns = namespace or "default"

    def ns_grant(any_of: tuple[str, ...], why: str, target: str = ns,
                 optional: bool = False) -> Grant:
        return Grant(kind="namespace", target=target, any_of=any_of, why=why,
                     optional=optional)

    out = [
        ns_grant(("list-jobs",), "list llmgw's jobs"),
        ns_grant(("read-job",), "read jobs, allocations, checks, deployments, services"),
        ns_grant(("submit-job", "register-job"), "register a model's job"),
        ns_grant(("submit-job", "plan-job"), "plan a job before registering it"),
        ns_grant(("scale-job", "submit-job"), "scale a model's replicas"),
        ns_grant(("submit-job", "deregister-job", "purge-job"), "stop a removed model's job"),
        ns_grant(("read-fs",), "read a fetch's progress, why an adapter's fetch failed and "
                 "a cache sweep's report"),
        Grant(kind="host_volume", target=cache_volume, any_of=("mount-readwrite",),
              why="register a job: every group mounts the weight cache writable"),
        Grant(kind="node", target="", any_of=("read",), why="read the fleet"),
        Grant(kind="node", target="", any_of=("write",),
              why="mark nodes holding a model's weights (warm placement, prefetch)",
              optional=True),
    ]
    out.extend(Grant(kind="variables", target=variables_glob(prefix), namespace=ns,
                     any_of=(cap,), why=f"{cap} the Variable holding the credentials of {what}")
               for prefix, what in ((JOB_PREFIX, "a model's replicas"),
                                    (PREFETCH_PREFIX, "a prefetch"),
                                    (ADAPTER_PREFIX, "an adapter's fetch"))
               for cap in ("read", "write"))
    out.append(ns_grant(("read-job",), "count what other namespaces' allocations hold in "
                        "the fleet view", target="*", optional=True))
    return out


_JOB = r"job/[^/]+"
# (method, path below /v1/ as a regex, what it needs: kinds with their capabilities)
_CALLS: list[tuple[str, str, tuple[tuple[str, ...], ...]]] = [
    ("GET", r"jobs", (("list-jobs",),)),
    ("POST|PUT", r"jobs|" + _JOB, (("submit-job", "register-job"), ("mount-readwrite",))),
    ("POST|PUT", _JOB + "/plan", (("submit-job", "plan-job"),)),
    ("POST|PUT", _JOB + "/scale", (("scale-job", "submit-job"),)),
    ("GET", _JOB + "/scale", (("read-job", "read-job-scaling"),)),
    ("DELETE", _JOB, (("submit-job", "deregister-job", "purge-job"),)),
    ("POST|PUT", r"validate/job", (("read-job",),)),
    ("GET", r"client/fs/.*", (("read-fs",),)),
    ("GET", r"nodes?(/.*)?", (("node:read",),)),
    ("POST|PUT", r"client/metadata", (("node:write",),)),
    ("GET", r"var/.+", (("var:read",),)),
    ("POST|PUT", r"var/.+", (("var:write",),)),
    ("GET", r"acl/.*", ()),
    ("GET", r".*", (("read-job",),)),
]


def needed_for(method: str, path: str, namespace: str, cache_volume: str) -> list[Grant]:
    """What Nomad requires of the token for ``method /v1/<path>``: the grants one of which
    it lacks when that call is refused."""
    ns = namespace or "default"
    for methods, pattern, needs in _CALLS:
        if method.upper() not in methods.split("|") or not re.fullmatch(pattern, path):
            continue
        out = []
        for caps in needs:
            if caps == ("mount-readwrite",):
                out.append(Grant(kind="host_volume", target=cache_volume, any_of=caps))
            elif caps[0].startswith("node:"):
                out.append(Grant(kind="node", target="", any_of=(caps[0][5:],)))
            elif caps[0].startswith("var:"):
                out.append(Grant(kind="variables", target=path.removeprefix("var/"),
                                 namespace=ns, any_of=(caps[0][4:],)))
            else:
                out.append(Grant(kind="namespace", target=ns, any_of=caps))
        return out
    return []


# ---- what a set of policies grants (acl/acl.go, over the server's RulesJSON) ----------

def _glob(pattern: str, text: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text, re.S) is not None


def _closest(sets: dict[str, set[str]], name: str) -> set[str] | None:
    found = [(len(name) - len(k) + k.count("*"), k) for k in sets if "*" in k and _glob(k, name)]
    return sets[min(found)[1]] if found else None


def _merge(into: dict[str, set[str]], name: str, caps: Iterable[str]) -> None:
    held = into.setdefault(name, set())
    if "deny" in held:
        return
    caps = set(caps)
    if "deny" in caps:
        held.clear()
        held.add("deny")
    else:
        held |= caps


class Granted:
    """What a token's policies allow, compiled once (acl/acl.go ``NewACL``)."""

    def __init__(self, rules: Sequence[PolicyRules], *, management: bool = False) -> None:
        self.management = management
        self.namespaces: dict[str, set[str]] = {}
        self.volumes: dict[str, set[str]] = {}
        self.variables: dict[str, dict[str, set[str]]] = {}
        self.node = ""
        order = ["", "read", "write"]
        for r in rules:
            for ns in r.Namespaces or ():
                _merge(self.namespaces, ns.Name, ns.Capabilities or ())
                paths = self.variables.setdefault(ns.Name, {})
                for p in (ns.Variables.Paths if ns.Variables else None) or ():
                    _merge(paths, p.PathSpec, p.Capabilities or ())
            for hv in r.HostVolumes or ():
                _merge(self.volumes, hv.Name, hv.Capabilities or ())
            level = r.Node.Policy if r.Node else ""
            if "deny" in (self.node, level):
                self.node = "deny"
            elif level in order:
                self.node = max(self.node, level, key=order.index)

    def _ns(self, name: str) -> set[str]:
        caps = self.namespaces.get(name)
        if caps is None:
            caps = _closest(self.namespaces, name)
        return caps or set()

    def allows(self, g: Grant) -> bool:
        if self.management:
            return True
        if g.kind == "namespace":
            # Every namespace ("*"): a rule for "*" itself, the glob matching any name.
            caps = self.namespaces.get("*", set()) if g.target == "*" else self._ns(g.target)
            return "deny" not in caps and any(c in caps for c in g.any_of)
        if g.kind == "host_volume":
            exact = self.volumes.get(g.target)
            caps = exact if exact is not None else (_closest(self.volumes, g.target) or set())
            return "deny" not in caps and any(c in caps for c in g.any_of)
        if g.kind == "node":
            want = g.any_of[0]
            return self.node == "write" or (self.node == "read" and want == "read")
        return self._variable(g)

    def _variable(self, g: Grant) -> bool:
        """A glob grant is checked as a path it covers (a model's job's path)."""
        ns_rules = self.variables.get(g.namespace)
        if ns_rules is None:
            ns_rules = next((v for k, v in sorted(self.variables.items(), key=lambda kv:
                                                  len(kv[0]), reverse=True)
                             if "*" in k and _glob(k, g.namespace)), {})
        path = g.target.replace("*", "example-model")
        caps = ns_rules.get(path)
        if caps is None:
            caps = _closest(ns_rules, path) or set()
        return "deny" not in caps and any(c in caps for c in g.any_of)
