"""ACL policies as Nomad reads them, tokens that carry them, and workload identities.

A policy is written in Nomad's policy language and applied the way ``nomad acl policy
apply`` does it, flags included; a token names policies; a running task holds a
workload identity. What each may do is decided by the rules below, each read from
hashicorp/nomad (the revision docs/nomad-api.md cites):

* **Parsing** — acl/policy.go (``Parse``, ``expandNamespacePolicy``,
  ``expandVariablesCapabilities``): ``namespace "<glob>"`` blocks with ``policy``
  (``read``/``write``/``scale``/``deny``, expanded to capabilities) and
  ``capabilities``, and inside them ``variables { path "<glob>" { capabilities } }``,
  where ``read`` implies ``list``; ``node``, ``agent``, ``operator`` … with a
  ``policy``. An unknown capability, policy or key is refused (strict parsing).
* **Matching** — acl/acl.go (``AllowNamespaceOperation``,
  ``matchingNamespaceCapabilitySet``, ``findClosestMatchingGlob``,
  ``matchingVariablesCapabilitySet``): an exact namespace wins over every glob, else
  the glob closest in length; ``deny`` clears a set. Variables: an exact path first,
  then a workload's implicit read/list of ``nomad/jobs``, ``nomad/jobs/<job>``,
  ``…/<group>`` and ``…/<group>/<task>`` in its own namespace, then the closest glob.
* **Attaching** — command/acl_policy_apply.go (``Run``) turns ``-namespace``,
  ``-job``, ``-group``, ``-task`` into the policy's ``JobACL``; nomad/auth/auth.go
  (``ResolvePoliciesForClaims``) hands a workload every policy attached to its
  namespace **with no job** (``-namespace`` alone: every workload there) plus those
  attached to its job (narrowed by group and task when given). A token's own
  policies are looked up by name whatever their ``JobACL``.
* **Requiring** — each endpoint checks one capability (nomad/job_endpoint.go
  ``Register``/``doRegister``: submit-job or register-job; ``Plan``: submit-job or
  plan-job; ``Deregister``: submit-job, purge-job or deregister-job; ``Scale``:
  scale-job or submit-job; ``ScaleStatus``: read-job or read-job-scaling;
  ``Validate``, ``GetJob``, ``Allocations`` …: read-job; ``List``: list-jobs;
  nomad/node_endpoint.go: node read; nomad/client_meta_endpoint.go ``NodeMeta.Apply``:
  node write, ``Read``: node read; command/agent/fs_endpoint.go (``cat/``): read-fs
  in the allocation's namespace; nomad/variables_endpoint.go ``Apply``/``Read``:
  the path's write/destroy/read). ``Job.Register`` also checks every host volume a
  group mounts (nomad/job_endpoint.go ``doRegister`` → acl/acl.go
  ``AllowHostVolumeOperation``): ``mount-readwrite`` for a writable volume,
  ``mount-readonly`` or ``mount-readwrite`` for a read-only one, looked up by the
  volume's ``Source`` exactly, then by the closest glob (``matchingHostVolumeCapabilitySet``);
  ``Job.Plan`` and ``Job.Validate`` check none of it. List answers spanning namespaces
  (``/v1/allocations?namespace=*``, ``/v1/node/:id/allocations``) drop what the
  token may not read rather than refusing (nomad/alloc_endpoint.go ``List``,
  nomad/node_endpoint.go ``GetAllocs``).

Denials answer ``403 Permission denied``; an unknown token ``403 ACL token not found``
(docs/nomad-api.md §7).
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.testing.fake_nomad.cluster import NomadError

Json = dict[str, Any]

# acl/policy.go: the capability sets the shorthand policies stand for.
_READ = ["list-jobs", "parse-job", "read-job", "csi-list-volume", "csi-read-volume",
         "read-job-scaling", "list-scaling-policies", "read-scaling-policy", "host-volume-read"]
_WRITE = [*_READ, "scale-job", "submit-job", "dispatch-job", "read-logs", "read-fs",
          "alloc-exec", "alloc-lifecycle", "csi-mount-volume", "csi-write-volume",
          "submit-recommendation", "host-volume-create"]
_SCALE = ["list-scaling-policies", "read-scaling-policy", "read-job-scaling", "scale-job",
          "read-job", "submit-recommendation"]
EXPAND = {"read": _READ, "write": _WRITE, "scale": _SCALE, "deny": ["deny"]}
NAMESPACE_CAPABILITIES = frozenset([
    *_WRITE, "deny", "alloc-node-exec", "sentinel-override", "csi-register-plugin",
    "host-volume-register", "host-volume-write", "host-volume-delete", "register-job",
    "revert-job", "deregister-job", "purge-job", "evaluate-job", "plan-job", "tag-job-version",
    "stable-job", "fail-deployment", "pause-deployment", "promote-deployment",
    "unblock-deployment", "cancel-deployment", "set-alloc-health-deployment", "gc-allocation",
    "pause-allocation", "force-periodic-job", "delete-service-registration"])
VARIABLE_CAPABILITIES = frozenset(["list", "read", "write", "destroy", "deny"])
_NAMESPACE_NAME = re.compile(r"^[a-zA-Z0-9-*]{1,128}$")
# acl/policy.go: validVolume, isHostVolumeCapabilityValid, expandHostVolumePolicy.
_VOLUME_NAME = re.compile(r"^[a-zA-Z0-9-*]{1,128}$")
HOST_VOLUME_CAPABILITIES = frozenset(["deny", "mount-readonly", "mount-readwrite"])
EXPAND_HOST_VOLUME = {"deny": ["deny"], "read": ["mount-readonly"],
                      "write": ["mount-readonly", "mount-readwrite"]}
_LEVELS = ("deny", "read", "write", "scale")
_TOKEN = re.compile(r'\s+|#[^\n]*|//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|[{}\[\]=,]|[^\s{}\[\]=,"]+',
                    re.S)


# -- the policy language --------------------------------------------------------------

def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise NomadError(400, f"Failed to parse ACL Policy: unexpected {text[pos]!r}")
        tok = m.group(0)
        pos = m.end()
        if not tok.isspace() and not tok.startswith(("#", "//", "/*")):
            out.append(tok)
    return out


def _value(tok: str) -> Any:
    if tok.startswith('"'):
        return json.loads(tok)
    if tok in ("true", "false"):
        return tok == "true"
    return tok


def _body(toks: list[str], i: int, closing: bool) -> tuple[list[tuple[str, list[str], Any]], int]:
    """Entries ``(key, labels, value or nested entries)`` up to the matching '}'."""
    entries: list[tuple[str, list[str], Any]] = []
    while i < len(toks):
        if toks[i] == "}":
            if not closing:
                raise NomadError(400, "Failed to parse ACL Policy: unexpected '}'")
            return entries, i + 1
        key, labels = toks[i], []
        i += 1
        while i < len(toks) and toks[i].startswith('"'):
            labels.append(_value(toks[i]))
            i += 1
        if i < len(toks) and toks[i] == "=":
            i += 1
            if toks[i] == "[":
                items, i = [], i + 1
                while toks[i] != "]":
                    if toks[i] != ",":
                        items.append(_value(toks[i]))
                    i += 1
                entries.append((key, labels, items))
                i += 1
            elif toks[i] == "{":
                nested, i = _body(toks, i + 1, True)
                entries.append((key, labels, nested))
            else:
                entries.append((key, labels, _value(toks[i])))
                i += 1
        elif i < len(toks) and toks[i] == "{":
            nested, i = _body(toks, i + 1, True)
            entries.append((_value(key) if key.startswith('"') else key, labels, nested))
        else:
            raise NomadError(400, f"Failed to parse ACL Policy: key {key!r} has no value")
    if closing:
        raise NomadError(400, "Failed to parse ACL Policy: missing '}'")
    return entries, i


@dataclass
class Namespace:
    name: str
    capabilities: set[str] = field(default_factory=set)
    variables: dict[str, set[str]] = field(default_factory=dict)
    level: str = ""             # the shorthand ``policy`` as written


@dataclass
class Policy:
    name: str
    rules: str
    namespaces: list[Namespace] = field(default_factory=list)
    levels: dict[str, str] = field(default_factory=dict)   # node, agent, operator, …
    job_acl: Json | None = None                             # {"Namespace","JobID","Group","Task"}
    host_volumes: list[tuple[str, str, list[str]]] = field(default_factory=list)
    #   (name, policy, capabilities with the policy expanded), in the order written
    description: str = ""


def _fields(entries: list[tuple[str, list[str], Any]], allowed: set[str], where: str) -> Json:
    out: Json = {}
    for key, labels, value in entries:
        if key not in allowed or key in out or labels:
            raise NomadError(400, f"Invalid or duplicate policy keys: {key} (in {where})")
        out[key] = value
    return out


def parse_policy(name: str, rules: str) -> Policy:
    """acl/policy.go ``Parse`` in its strict mode; NomadError(400) for what it refuses."""
    policy = Policy(name=name, rules=rules)
    for key, labels, value in _body(_tokens(rules), 0, False)[0]:
        if key == "namespace":
            if len(labels) != 1 or not _NAMESPACE_NAME.match(labels[0]):
                raise NomadError(400, f"Invalid namespace name: {labels}")
            body = _fields(value, {"policy", "capabilities", "variables"}, f"namespace {labels[0]}")
            ns = Namespace(labels[0])
            level = body.get("policy", "")
            ns.level = level
            if level and level not in _LEVELS:
                raise NomadError(400, f"Invalid namespace policy: {level!r}")
            for cap in body.get("capabilities", []):
                if cap not in NAMESPACE_CAPABILITIES:
                    raise NomadError(400, f"Invalid namespace capability '{cap}'")
            ns.capabilities = {*body.get("capabilities", []), *EXPAND.get(level, [])}
            for vkey, vlabels, paths in body.get("variables", []):
                if vkey != "path" or len(vlabels) != 1:
                    raise NomadError(400, f"Invalid or duplicate policy keys: {vkey}")
                spec = vlabels[0]
                if spec.startswith("/"):
                    raise NomadError(400, f"Invalid variable path {spec!r} in namespace "
                                          f"{ns.name}: cannot start with a leading '/'")
                caps = set(_fields(paths, {"capabilities"}, f"path {spec}")
                           .get("capabilities", []))
                if not caps <= VARIABLE_CAPABILITIES:
                    raise NomadError(400, f"Invalid variable capability in namespace {ns.name}")
                if "deny" in caps:
                    caps = {"deny"}
                elif "read" in caps:
                    caps.add("list")
                ns.variables[spec] = caps
            policy.namespaces.append(ns)
        elif key in ("node", "agent", "operator", "quota", "plugin") and not labels:
            level = _fields(value, {"policy", "capabilities"}, key).get("policy", "")
            if level not in ("deny", "read", "write", "list"):
                raise NomadError(400, f"Invalid {key} policy: {level!r}")
            policy.levels[key] = level
        elif key == "host_volume" and len(labels) == 1:
            body = _fields(value, {"policy", "capabilities"}, f"host_volume {labels[0]}")
            name, level = labels[0], body.get("policy", "")
            if not _VOLUME_NAME.match(name):
                raise NomadError(400, f"Invalid host volume name: {name!r}")
            if level and level not in _LEVELS:
                raise NomadError(400, f"Invalid host volume policy: {level!r}")
            written = list(body.get("capabilities", []))
            for cap in written:
                if cap not in HOST_VOLUME_CAPABILITIES:
                    raise NomadError(400, f"Invalid host volume capability '{cap}'")
            policy.host_volumes.append(
                (name, level, [*written, *EXPAND_HOST_VOLUME.get(level, [])]))
        elif key == "node_pool" and len(labels) == 1:
            _fields(value, {"policy", "capabilities"}, f"{key} {labels[0]}")
        else:
            raise NomadError(400, f"Invalid or duplicate policy keys: {key}")
    if not policy.namespaces and not policy.levels and not policy.host_volumes:
        raise NomadError(400, f"Invalid policy: {rules}")
    return policy


def rules_json(policy: Policy) -> Json:
    """``RulesJSON`` of ``GET /v1/acl/policy/:name``: acl.Policy as the server parsed it
    (nomad/acl_endpoint.go ``GetPolicy`` runs acl/policy.go ``Parse``, which appends each
    shorthand's capabilities and ``list`` to a variables ``read``), go-codec field names."""
    def ns_json(ns: Namespace) -> Json:
        paths = [{"PathSpec": spec, "Capabilities": sorted(caps)}
                 for spec, caps in ns.variables.items()]
        return {"Name": ns.name, "Policy": ns.level, "Capabilities": sorted(ns.capabilities),
                "Variables": {"Paths": paths} if paths else None}

    def level(key: str) -> Json | None:
        return {"Policy": policy.levels[key]} if key in policy.levels else None

    return {
        "Namespaces": [ns_json(ns) for ns in policy.namespaces] or None,
        "NodePools": None,
        "HostVolumes": [{"Name": n, "Policy": lvl, "Capabilities": caps}
                        for n, lvl, caps in policy.host_volumes] or None,
        "Agent": level("agent"), "Node": level("node"), "Operator": level("operator"),
        "Quota": level("quota"), "Plugin": level("plugin"), "Raw": policy.rules,
        "ExtraKeysHCL": None,
    }


# -- what a set of policies allows -------------------------------------------------------

def _glob(pattern: str, text: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text, re.S) is not None


def _closest(sets: dict[str, set[str]], name: str) -> set[str] | None:
    """acl/acl.go ``findClosestMatchingGlob``: the matching glob nearest in length."""
    found = [(len(name) - len(k) + k.count("*"), k) for k in sets if "*" in k and _glob(k, name)]
    return sets[min(found)[1]] if found else None


@dataclass(frozen=True)
class Claim:
    """A workload identity: what nomad/auth/auth.go reads off the task's token."""

    namespace: str
    job: str
    group: str
    task: str


class Acl:
    """Compiled policies (acl/acl.go ``NewACL``); ``management`` allows everything."""

    def __init__(self, policies: list[Policy], *, management: bool = False,
                 claim: Claim | None = None, token: Token | None = None) -> None:
        self.management = management
        self.claim = claim
        self.token = token
        self.policy_names = {p.name for p in policies}
        self.namespaces: dict[str, set[str]] = {}
        self.variables: dict[str, set[str]] = {}
        self.levels: dict[str, str] = {}
        self.host_volumes: dict[str, set[str]] = {}
        for p in policies:
            for name, _level, hv_caps in p.host_volumes:
                held = self.host_volumes.setdefault(name, set())
                if "deny" in held:
                    continue        # deny always takes precedence (acl/acl.go NewACL)
                if "deny" in hv_caps:
                    held.clear()
                    held.add("deny")
                else:
                    held.update(hv_caps)
            for ns in p.namespaces:
                caps = self.namespaces.setdefault(ns.name, set())
                if "deny" in caps:
                    continue
                caps |= {"deny"} if "deny" in ns.capabilities else ns.capabilities
                if "deny" in caps:
                    caps.intersection_update({"deny"})
                for spec, vcaps in ns.variables.items():
                    self.variables.setdefault(f"{ns.name}\x00{spec}", set()).update(vcaps)
            for key, level in p.levels.items():
                order = ["", "list", "read", "write"]
                old = self.levels.get(key, "")
                if "deny" in (old, level):
                    self.levels[key] = "deny"
                else:
                    self.levels[key] = max(old, level, key=order.index)

    def allow_ns(self, namespace: str, *capabilities: str) -> bool:
        if self.management:
            return True
        if namespace == "*":
            return any(c in caps for caps in self.namespaces.values() for c in capabilities)
        caps = self.namespaces.get(namespace)
        if caps is None:
            caps = _closest(self.namespaces, namespace) or set()
        return "deny" not in caps and any(c in caps for c in capabilities)

    def allow_level(self, key: str, write: bool = False) -> bool:
        level = self.levels.get(key, "")
        return self.management or level == "write" or (level == "read" and not write)

    def allow_host_volume(self, name: str, capability: str) -> bool:
        """acl/acl.go ``AllowHostVolumeOperation``: the exact name, else the closest glob."""
        if self.management:
            return True
        caps = self.host_volumes.get(name)
        if caps is None:
            caps = _closest(self.host_volumes, name)
        return caps is not None and capability in caps

    def allow_variable(self, namespace: str, path: str, capability: str) -> bool:
        if self.management:
            return True
        caps = self.variables.get(f"{namespace}\x00{path}")
        c = self.claim
        if caps is None and c is not None and namespace == c.namespace and path in (
                "nomad/jobs", f"nomad/jobs/{c.job}", f"nomad/jobs/{c.job}/{c.group}",
                f"nomad/jobs/{c.job}/{c.group}/{c.task}"):
            caps = {"read", "list"}
        if caps is None:
            caps = _closest(self.variables, f"{namespace}\x00{path}") or set()
        return "deny" not in caps and capability in caps


# -- the store of policies and tokens ------------------------------------------------------

@dataclass(frozen=True)
class Token:
    """An ACL token as nomad/structs/acl.go ``ACLToken`` holds it."""

    accessor: str
    secret: str
    name: str
    type: str                   # "client" or "management"
    policies: tuple[str, ...] = ()
    create_index: int = 0

    def wire(self) -> Json:
        return {"AccessorID": self.accessor, "SecretID": self.secret, "Name": self.name,
                "Type": self.type, "Policies": list(self.policies) or None, "Roles": None,
                "Global": False, "Hash": "", "CreateTime": "2025-01-01T00:00:00Z",
                "ExpirationTime": None, "ExpirationTTL": 0,
                "CreateIndex": self.create_index, "ModifyIndex": self.create_index}


# nomad/structs/acl.go: the identities Nomad answers /v1/acl/token/self with when no
# token is sent (ACLs on) and when ACLs are off.
ANONYMOUS = Token(accessor="anonymous", secret="", name="Anonymous Token", type="client",
                  policies=("anonymous",))
ACLS_DISABLED = Token(accessor="acls-disabled", secret="", name="ACLs disabled token",
                      type="client")


@dataclass
class Registry:
    """Policies by name, tokens by secret, and workload identities by secret."""

    management: set[str] = field(default_factory=set)
    policies: dict[str, Policy] = field(default_factory=dict)
    tokens: dict[str, Token] = field(default_factory=dict)
    workloads: dict[str, Claim] = field(default_factory=dict)

    def apply(self, name: str, rules: str, *, namespace: str = "", job: str = "",
              group: str = "", task: str = "") -> Policy:
        """``nomad acl policy apply [-namespace NS [-job J [-group G [-task T]]]] NAME FILE``
        with the command's own flag checks (command/acl_policy_apply.go ``Run``)."""
        if job and not namespace:
            raise ValueError("-namespace is required if -job is set")
        if group and not job:
            raise ValueError("-job is required if -group is set")
        if task and not group:
            raise ValueError("-group is required if -task is set")
        policy = parse_policy(name, rules)
        if namespace:
            policy.job_acl = {"Namespace": namespace, "JobID": job, "Group": group, "Task": task}
        self.policies[name] = policy
        return policy

    def token(self, policies: list[str], name: str = "", *, management: bool = False) -> str:
        """``nomad acl token create``: secret and accessor are UUIDs, as Nomad makes them."""
        secret = str(uuid.uuid4())
        self.tokens[secret] = Token(accessor=str(uuid.uuid4()), secret=secret, name=name,
                                    type="management" if management else "client",
                                    policies=() if management else tuple(policies),
                                    create_index=len(self.tokens) + 1)
        return secret

    def token_of(self, secret: str) -> Token | None:
        """The token behind a secret; the bootstrap secret the fake was started with too."""
        if secret in self.management and secret not in self.tokens:
            self.tokens[secret] = Token(accessor=str(uuid.uuid5(uuid.NAMESPACE_OID, secret)),
                                        secret=secret, name="Bootstrap Token",
                                        type="management")
        return self.tokens.get(secret)

    def identity(self, claim: Claim) -> str:
        secret = "wi." + secrets.token_hex(16)
        self.workloads[secret] = claim
        return secret

    def for_workload(self, claim: Claim) -> list[Policy]:
        """nomad/auth/auth.go ``ResolvePoliciesForClaims``."""
        out = []
        for p in self.policies.values():
            j = p.job_acl
            if j is None or j["Namespace"] != claim.namespace:
                continue
            if not j["JobID"]:
                out.append(p)   # attached to the namespace: every workload in it
            elif j["JobID"] == claim.job and j["Group"] in ("", claim.group) and \
                    j["Task"] in ("", claim.task):
                out.append(p)
        return out

    def resolve(self, secret: str) -> Acl:
        token = self.token_of(secret)
        if token is not None and token.type == "management":
            return Acl([], management=True, token=token)
        if token is not None:
            return Acl([self.policies[n] for n in token.policies if n in self.policies],
                       token=token)
        claim = self.workloads.get(secret)
        if claim is not None:
            return Acl(self.for_workload(claim), claim=claim)
        raise NomadError(403, "ACL token not found")


# -- what each endpoint requires -----------------------------------------------------------

Check = Callable[[Acl, str, Any], bool]


def _ns(*caps: str) -> Check:
    return lambda acl, ns, _req: acl.allow_ns(ns, *caps)


def _node(acl: Acl, _ns: str, _req: Any) -> bool:
    return acl.allow_level("node")


def _node_write(acl: Acl, _ns: str, _req: Any) -> bool:
    return acl.allow_level("node", write=True)


def _agent(acl: Acl, _ns: str, _req: Any) -> bool:
    return acl.allow_level("agent")


def _variable(capability: str) -> Check:
    def check(acl: Acl, ns: str, req: Any) -> bool:
        return acl.allow_variable(ns, req.path.removeprefix("/v1/var/"), capability)
    return check


_JOB = r"/v1/job/[^/]+"
RULES: list[tuple[str, str, Check]] = [
    ("GET", r"/v1/jobs", _ns("list-jobs")),
    ("PUT|POST", r"/v1/jobs|" + _JOB, _ns("submit-job", "register-job")),
    ("PUT|POST", _JOB + "/plan", _ns("submit-job", "plan-job")),
    ("PUT|POST", _JOB + "/evaluate", _ns("submit-job", "evaluate-job")),
    ("PUT|POST", _JOB + "/scale", _ns("scale-job", "submit-job")),
    ("GET", _JOB + "/scale", _ns("read-job", "read-job-scaling")),
    ("DELETE", _JOB, _ns("submit-job", "purge-job", "deregister-job")),
    ("PUT|POST", r"/v1/validate/job", _ns("read-job")),
    # client/fs_endpoint.go ``logs``: read-fs or read-logs.
    ("GET", r"/v1/client/fs/logs/.*", _ns("read-fs", "read-logs")),
    ("GET", r"/v1/client/fs/.*", _ns("read-fs")),
    ("GET", r"/v1/(job|allocation|evaluation|deployment|client/allocation)/.*", _ns("read-job")),
    ("GET", r"/v1/(allocations|evaluations|deployments|services|service/.*)", _ns("read-job")),
    ("GET", r"/v1/nodes?(/.*)?", _node),
    ("GET", r"/v1/client/metadata", _node),
    ("PUT|POST", r"/v1/client/metadata", _node_write),
    ("GET", r"/v1/agent/.*", _agent),
    ("GET", r"/v1/var/.+", _variable("read")),
    ("PUT|POST", r"/v1/var/.+", _variable("write")),
    ("DELETE", r"/v1/var/.+", _variable("destroy")),
    ("GET", r"/v1/vars", _ns("read-job", "list-jobs")),
]
# Answers spanning namespaces that Nomad filters by read-job rather than refusing.
_FILTERED = re.compile(r"/v1/allocations|/v1/node/[^/]+/allocations")


def request_namespace(req: Any) -> str:
    """The namespace a request acts in: the query, else the body's, else the job's."""
    if req.query.get("namespace"):
        return str(req.query["namespace"])
    try:
        body = json.loads(req.body) if req.body else None
    except ValueError:
        body = None
    if isinstance(body, dict):
        job = body.get("Job")
        inner = job.get("Namespace") if isinstance(job, dict) else None
        return str(body.get("Namespace") or inner or "default")
    return "default"


def authorize(registry: Registry, req: Any) -> Acl:
    """The token's ACL if it may make ``req``; NomadError(403) otherwise."""
    if not req.token:
        raise NomadError(403, "Permission denied")
    acl = registry.resolve(req.token)
    ns = request_namespace(req)
    for methods, pattern, check in RULES:
        if req.method in methods.split("|") and re.fullmatch(pattern, req.path):
            if not check(acl, ns, req):
                raise NomadError(403, "Permission denied")
            return acl
    if req.path.startswith(("/v1/status/", "/v1/regions")):
        return acl
    if not acl.management:
        raise NomadError(403, "Permission denied")
    return acl


def check_volumes(acl: Acl, job: Json) -> None:
    """The volume permissions ``Job.Register`` checks after the job was admitted
    (nomad/job_endpoint.go ``doRegister``, "Validate Volume Permissions"); NomadError(403)
    when the token may not mount one. A CSI volume needs ``csi-mount-volume`` in the job's
    namespace (``allowCSIMount``); any other type is refused."""
    for tg in job.get("TaskGroups") or []:
        volumes = tg.get("Volumes") or {}
        for vol in volumes.values():
            kind, source = vol.get("Type", ""), vol.get("Source", "")
            if kind == "host":
                ok = acl.allow_host_volume(source, "mount-readwrite") or (
                    bool(vol.get("ReadOnly")) and acl.allow_host_volume(source,
                                                                         "mount-readonly"))
            elif kind == "csi":
                ok = acl.allow_ns(job.get("Namespace", "default"), "csi-mount-volume")
            else:
                ok = False
            if not ok:
                raise NomadError(403, "Permission denied")
        for task in tg.get("Tasks") or []:
            for vm in task.get("VolumeMounts") or []:
                vol = volumes.get(vm.get("Volume", "")) or {}
                if vm.get("PropagationMode") == "bidirectional" and not acl.allow_host_volume(
                        vol.get("Source", ""), "mount-readwrite"):
                    raise NomadError(403, "Permission denied")


def filter_answer(acl: Acl, req: Any, answer: Any) -> Any:
    """Drop the allocations of namespaces ``acl`` may not read from a list answer (JSON
    text or a decoded list)."""
    if acl.management or answer is None or not _FILTERED.fullmatch(req.path):
        return answer
    items = json.loads(answer) if isinstance(answer, str | bytes) else answer
    if not isinstance(items, list):
        return answer
    kept = [a for a in items if acl.allow_ns(a.get("Namespace", "default"), "read-job")]
    return json.dumps(kept) if isinstance(answer, str | bytes) else kept
