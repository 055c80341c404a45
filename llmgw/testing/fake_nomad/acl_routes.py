"""``GET /v1/acl/token/self`` and ``GET /v1/acl/policy/:name``: who a token is, and its rules.

command/agent/acl_endpoint.go ``aclTokenSelf`` answers the token behind the request
(nomad/acl_endpoint.go ``WhoAmI``), SecretID included since the caller holds it:
with no token and ACLs on, the anonymous token (nomad/structs/acl.go
``AnonymousACLToken``); a secret Nomad does not know, ``403 ACL token not found``; a
workload identity, which is no ACL token, ``404 ACL token not found``; with ACLs off,
``200`` and the ``acls-disabled`` token (``ACLsDisabledToken``), since ``WhoAmI`` does
not check whether ACLs are enabled.

``aclPolicyQuery`` answers one policy with its ``Rules`` as written and ``RulesJSON``,
the server's parse of them (``acl.rules_json``). ``ACL.GetPolicy`` refuses with ``400 ACL
support disabled`` when ACLs are off (``aclDisabled``), lets a management token read any
policy and any other token only the policies it carries
(``getPolicyAuthorizationFunc``), else ``403 Permission denied``; an unknown name is
``404 ACL policy not found``.
"""

from __future__ import annotations

import re

from llmgw.testing.fake_nomad import acl
from llmgw.testing.fake_nomad.cluster import NomadError
from llmgw.testing.fake_nomad.server import Api, Request, Response, Route, meta


def token_self(api: Api, req: Request) -> Response:
    registry = api.acls
    if registry is None:
        return Response(body=acl.ACLS_DISABLED.wire(), headers=meta(1))
    if not req.token:
        return Response(body=acl.ANONYMOUS.wire(), headers=meta(1))
    if req.token in registry.workloads:
        raise NomadError(404, "ACL token not found")
    token = registry.token_of(req.token)
    if token is None:
        raise NomadError(403, "ACL token not found")
    return Response(body=token.wire(), headers=meta(max(1, token.create_index)))


def get_policy(api: Api, req: Request) -> Response:
    registry = api.acls
    if registry is None:
        raise NomadError(400, "ACL support disabled")
    name = req.params["name"]
    if not name:
        raise NomadError(400, "Missing Policy Name")
    caller = registry.resolve(req.token) if req.token else acl.Acl([])
    if name != "anonymous" and not caller.management and name not in caller.policy_names:
        raise NomadError(403, "Permission denied")
    policy = registry.policies.get(name)
    if policy is None:
        raise NomadError(404, "ACL policy not found")
    return Response(body={"Name": policy.name, "Description": policy.description,
                          "Rules": policy.rules, "RulesJSON": acl.rules_json(policy),
                          "JobACL": policy.job_acl, "Hash": "", "CreateIndex": 1,
                          "ModifyIndex": 1}, headers=meta(1))


ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(r"/v1/acl/token/self"), {"GET": token_self}),
    (re.compile(r"/v1/acl/policy/(?P<name>[^/]*)"), {"GET": get_policy}),
]
