"""Nomad's validation rules for the blocks of a job: constraints, policies, services.

Each function mirrors one ``Validate`` method of nomad/structs at the reference commit
(``Constraint``, ``Affinity``, ``Spread``, ``UpdateStrategy``, ``RestartPolicy``,
``ReschedulePolicy``, ``Service``, ``ServiceCheck``) and returns that method's error
list with Nomad's wording; ``validate.py`` nests them the way their callers do.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from llmgw.testing.fake_nomad.attributes import version_matches
from llmgw.testing.fake_nomad.gotext import duration as d
from llmgw.testing.fake_nomad.gotext import quote as q

Json = dict[str, Any]
SERVICE_NAME = re.compile(r"^(?i:[a-z0-9]|[a-z0-9][a-z0-9\-]{0,61}[a-z0-9])$")
_EXACT_TARGETS = {"${node.unique.id}", "${node.datacenter}", "${node.unique.name}",
                  "${node.class}", "${node.pool}"}
ORDER_OPS = {"=", "==", "is", "!=", "not", "<", "<=", ">", ">="}
SECOND = 1_000_000_000


def constraint(c: Json) -> list[str]:
    errs = []
    op, lt, rt = c.get("Operand", ""), c.get("LTarget", ""), c.get("RTarget", "")
    if not op:
        errs.append("Missing constraint operand")
    if op in ("set_contains", "set_contains_all", "set_contains_any") and not rt:
        errs.append("Set contains constraint requires an RTarget")
    elif op == "regexp":
        try:
            re.compile(rt)
        except re.error as exc:
            errs.append(f"Regular expression failed to compile: {exc}")
    elif op in ("version", "semver") and version_matches("0.0.0", rt) is None:
        errs.append(f"{'Semver' if op == 'semver' else 'Version'} constraint is invalid: "
                    f"Malformed constraint: {rt}")
    elif op in ("is_set", "is_not_set") and rt:
        errs.append(f"Operator {q(op)} does not support an RTarget")
    elif op in ORDER_OPS and not rt:
        errs.append(f"Operator {q(op)} requires an RTarget")
    elif op not in ORDER_OPS and op not in ("distinct_hosts", "distinct_property", "regexp",
                                             "version", "semver", "is_set", "is_not_set",
                                             "set_contains", "set_contains_all",
                                             "set_contains_any"):
        errs.append(f"Unknown constraint type {q(op)}")
    if op != "distinct_hosts":
        if not lt:
            errs.append("no attribute provided but is required by operator")
        elif lt.startswith("$"):
            if not lt.startswith("${"):
                errs.append(f"attribute {q(lt)} is missing an opening brace")
            elif not lt.endswith("}"):
                errs.append(f"attribute {q(lt)} is missing a closing brace")
            elif lt not in _EXACT_TARGETS and not lt.startswith(("${attr.", "${device.",
                                                                 "${meta.")):
                errs.append(f"unsupported attribute {q(lt)}")
    return errs


def affinity(a: Json) -> list[str]:
    errs = []
    op = a.get("Operand", "")
    if not op:
        errs.append("Missing affinity operand")
    if op in ORDER_OPS and not a.get("RTarget"):
        errs.append(f"Operator {q(op)} requires an RTarget")
    if not a.get("LTarget"):
        errs.append("No LTarget provided but is required")
    w = a.get("Weight", 0)
    if w == 0:
        errs.append("Affinity weight cannot be zero")
    if not -100 <= w <= 100:
        errs.append("Affinity weight must be within the range [-100,100]")
    return errs


def update_strategy(u: Json) -> list[str]:
    errs = []
    if u.get("HealthCheck") not in ("checks", "task_states", "manual"):
        errs.append(f"Invalid health check given: {q(u.get('HealthCheck', ''))}")
    mht, hd, pd = u["MinHealthyTime"], u["HealthyDeadline"], u["ProgressDeadline"]
    if u["MaxParallel"] < 0:
        errs.append(f"Max parallel can not be less than zero: {u['MaxParallel']} < 0")
    if u["Canary"] < 0:
        errs.append(f"Canary count can not be less than zero: {u['Canary']} < 0")
    if u["Canary"] == 0 and u["AutoPromote"]:
        errs.append("Auto Promote requires a Canary count greater than zero")
    if mht < 0:
        errs.append(f"Minimum healthy time may not be less than zero: {d(mht)}")
    if hd <= 0:
        errs.append(f"Healthy deadline must be greater than zero: {d(hd)}")
    if pd < 0:
        errs.append(f"Progress deadline must be zero or greater: {d(pd)}")
    if mht >= hd:
        errs.append(f"Minimum healthy time must be less than healthy deadline: {d(mht)} > {d(hd)}")
    if pd != 0 and hd >= pd:
        errs.append(f"Healthy deadline must be less than progress deadline: {d(hd)} > {d(pd)}")
    if u["Stagger"] <= 0:
        errs.append(f"Stagger must be greater than zero: {d(u['Stagger'])}")
    return errs


def spread(sp: Json) -> list[str]:
    errs = []
    if not sp.get("Attribute"):
        errs.append("Missing spread attribute")
    if not 0 < sp.get("Weight", 0) <= 100:
        errs.append("Spread block must have a positive weight from 0 to 100")
    seen: set[str] = set()
    total = 0
    for t in sp.get("SpreadTarget", []):
        value = t.get("Value", "")
        if value in seen:
            errs.append(f"Spread target value {q(value)} already defined")
        seen.add(value)
        if t.get("Percent", 0) > 100:
            errs.append(f"Spread target percentage for value {q(value)} must be between 0 "
                        "and 100")
        total += t.get("Percent", 0)
    if total > 100:
        errs.append(f"Sum of spread target percentages must not be greater than 100%; "
                    f"got {total}%")
    return errs


def restart_policy(r: Json) -> list[str]:
    errs = []
    if r["Mode"] not in ("delay", "fail"):
        errs.append(f"Unsupported restart mode: {q(r['Mode'])}")
    if r["Attempts"] == 0 and r["Mode"] != "fail":
        errs.append(f"Restart policy {q(r['Mode'])} with {r['Attempts']} attempts is ambiguous")
    if r["Interval"] < 5 * SECOND:
        errs.append(f"Interval can not be less than 5s (got {d(r['Interval'])})")
    if r["Attempts"] * r["Delay"] > r["Interval"]:
        errs.append(f"Nomad can't restart the TaskGroup {r['Attempts']} times in an interval of "
                    f"{d(r['Interval'])} with a delay of {d(r['Delay'])}")
    return errs


def reschedule_policy(r: Json) -> list[str]:
    if not (r["Attempts"] > 0 or r["Unlimited"]):
        return []
    errs = []
    if r["Delay"] < 5 * SECOND:
        errs.append(f"Delay cannot be less than 5s (got {d(r['Delay'])})")
    if r["DelayFunction"] not in ("constant", "exponential", "fibonacci"):
        errs.append(f"Invalid delay function {q(r['DelayFunction'])}, must be one of "
                    '["constant" "exponential" "fibonacci"]')
    if r["DelayFunction"] != "constant" and r["MaxDelay"] < r["Delay"]:
        errs.append(f"Max Delay cannot be less than Delay {d(r['Delay'])} "
                    f"(got {d(r['MaxDelay'])})")
    if not r["Unlimited"] and r["Interval"] < 15 * SECOND:
        errs.append(f"Interval cannot be less than 15s (got {d(r['Interval'])})")
    return errs


def service(svc: Json) -> list[str]:
    errs = []
    name = svc.get("Name", "")
    if not SERVICE_NAME.match(re.sub(r"\$\{[^}]*\}", "ENV-VAR", name)):
        errs.append("Service name must be valid per RFC 1123 and can contain only alphanumeric "
                    f"characters or dashes and must be no longer than 63 characters: {q(name)}")
    provider = svc.get("Provider", "")
    if provider not in ("consul", "nomad"):
        errs.append(f'Service provider must be "consul", or "nomad"; not {q(provider)}')
    for check in svc.get("Checks", []):
        if not svc.get("PortLabel") and not check.get("PortLabel") and \
                check.get("Type") in ("http", "tcp", "grpc"):
            errs.append(f"Check {check.get('Name', '')} invalid: check requires a port but "
                        f"neither check nor service {q(name)} have a port")
            continue
        e = service_check(check, provider)
        if e:
            errs.append(e if provider == "nomad" else f"Check {check.get('Name', '')} invalid: {e}")
    return errs


def service_check(c: Json, provider: str) -> str | None:
    """ServiceCheck.validateCommon + validateNomad (nomad/structs/services.go l.257-409)."""
    allowed = ["tcp", "http"] if provider == "nomad" else ["grpc", "tcp", "http", "script"]
    ctype = c.get("Type", "").lower()
    if ctype not in allowed:
        return f"invalid check type ({q(ctype)}), must be one of {', '.join(allowed)}"
    if ctype == "http":
        path = c.get("Path", "")
        if not path:
            return "http type must have http path"
        if urlparse(path).scheme:
            return "http type must have relative http path"
    interval, timeout = c.get("Interval", 0), c.get("Timeout", 0)
    if interval == 0:
        return "missing required value interval. Interval cannot be less than 1s"
    if interval < SECOND:
        return f"interval ({d(interval)}) cannot be lower than 1s"
    if timeout == 0:
        return "missing required value timeout. Timeout cannot be less than 1s"
    if timeout < SECOND:
        return f"timeout ({d(timeout)}) is lower than required minimum timeout 1s"
    if provider != "nomad":
        return None
    if c.get("Expose"):
        return "expose may only be set for Consul service checks"
    if c.get("OnUpdate") == "ignore_warnings":
        return "on_update may only be set to ignore_warnings for Consul service checks"
    if c.get("AddressMode") == "driver":
        return "address_mode = driver may only be set for Consul service checks"
    for key, label in (("SuccessBeforePassing", "success_before_passing"),
                       ("FailuresBeforeCritical", "failures_before_critical"),
                       ("FailuresBeforeWarning", "failures_before_warning"),
                       ("TLSServerName", "tls_server_name")):
        if c.get(key):
            return f"{label} may only be set for Consul service checks"
    return None
