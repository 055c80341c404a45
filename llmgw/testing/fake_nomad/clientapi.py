"""Client endpoints the servers forward to one node: dynamic metadata and allocation files.

**Dynamic node metadata** (``/v1/client/metadata``, Nomad ≥ 1.5). The server checks the
token and forwards the call to the node named by ``node_id`` (nomad/client_meta_endpoint.go
``NodeMeta.Apply``: ``node:write``; ``NodeMeta.Read``: ``node:read``); the client checks
again and applies it (client/meta_endpoint.go ``NodeMeta.Apply``):

* the request is ``{"NodeID": …, "Meta": {key: value-or-null}}``; an empty ``Meta`` is
  refused, and every key must be a dotted HCL identifier, because keys are meant to be
  interpolated in constraints (nomad/structs/node.go ``NodeMetaApplyRequest.Validate``:
  400 ``"<key>" is invalid; metadata keys must be valid dotted hcl identifiers``);
* the dynamic set is the old one with the request copied over it (``maps.Copy``); a
  null value is kept in the dynamic set as an unset, and deletes the key from the
  node's ``Meta`` — a static key included, until the agent restarts;
* the answer is ``{"Meta": merged, "Dynamic": dynamic, "Static": static}``, and the node
  is re-registered with the servers, where ``Node.Meta`` (and so the computed class,
  constraints and affinities on ``${meta.*}``) changes. Nomad batches that update by up
  to 10 s (api/node_meta.go ``Read``); the fake applies it at once.

**Allocation files** (``/v1/client/fs/cat/:alloc_id?path=…``) read a file of the
allocation's directory on its node: ``alloc/`` (shared by its tasks, ``NOMAD_ALLOC_DIR``)
or ``<task>/local/``. It needs ``read-fs`` in the allocation's namespace
(command/agent/fs_endpoint.go, the ``cat/`` case). The fake has no
directories: a test writes a file with ``FakeNomad.write_alloc_file``, as the task would.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmgw.testing.fake_nomad.cluster import Cluster, NomadError
from llmgw.testing.fake_nomad.records import Node
from llmgw.testing.fake_nomad.server import Api, Request, Response, Route

Json = dict[str, Any]
# hclsyntax.ValidIdentifier: a letter or '_' first, then letters, digits, '_' and '-'.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def validate_keys(meta: dict[str, Any]) -> None:
    if not meta:
        raise NomadError(400, "missing required Meta object")
    for key in meta:
        if key == "":
            raise NomadError(400, "metadata keys must not be empty")
        if not all(_IDENT.fullmatch(part) for part in key.split(".")):
            raise NomadError(400, f'"{key}" is invalid; metadata keys must be valid dotted '
                                  "hcl identifiers")


def merged(static: dict[str, str], dynamic: dict[str, str | None]) -> dict[str, str]:
    out = dict(static)
    for key, value in dynamic.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def apply(cluster: Cluster, node: Node, meta: dict[str, str | None]) -> None:
    """Copy ``meta`` over the node's dynamic metadata; the caller holds the store's lock."""
    store = cluster.store
    if node.static_meta is None:
        node.static_meta = dict(node.meta)
    node.dynamic_meta = {**node.dynamic_meta, **meta}
    before = node.meta
    node.meta = merged(node.static_meta, node.dynamic_meta)
    node.modify_index = store.write("nodes")
    if node.meta != before:
        # Node.Meta is part of the computed class (nomad/structs/node_class.go HashInclude):
        # evaluations waiting for a node like this one are tried again.
        cluster.submit(cluster.unblock)


def _answer(node: Node) -> Json:
    return {"Meta": node.meta, "Dynamic": node.dynamic_meta or None,
            "Static": node.static_meta if node.static_meta is not None else node.meta}


def _node(api: Api, node_id: str) -> Node:
    if not node_id:
        raise NomadError(400, "missing node_id: this agent is a server; name the node whose "
                              "metadata to read or change")
    node = api.store.nodes.get(node_id)
    if node is None:
        raise NomadError(404, f"Unknown node {node_id!r}")
    if node.status == "down":
        raise NomadError(404, "No path to node")
    return node


def read_meta(api: Api, req: Request) -> Response:
    with api.store.cond:
        return Response(body=_answer(_node(api, req.query.get("node_id", ""))))


def apply_meta(api: Api, req: Request) -> Response:
    try:
        body = json.loads(req.body or b"{}")
    except ValueError:
        raise NomadError(400, "failed to decode request body") from None
    if not isinstance(body, dict) or not isinstance(body.get("Meta") or {}, dict):
        raise NomadError(400, "failed to decode request body: Meta must be an object")
    meta = body.get("Meta") or {}
    if any(v is not None and not isinstance(v, str) for v in meta.values()):
        raise NomadError(400, "failed to decode request body: Meta values are strings or null")
    with api.store.cond:
        node = _node(api, body.get("NodeID") or req.query.get("node_id", ""))
        validate_keys(meta)
        apply(api.cluster, node, meta)
        return Response(body=_answer(node))


def cat(api: Api, req: Request) -> Response:
    path = req.query.get("path", "").lstrip("/")
    if not path:
        raise NomadError(400, "must provide a file path")
    with api.store.cond:
        a = api.store.allocs.get(req.params["id"])
        if a is None:
            raise NomadError(404, f'Unknown allocation "{req.params["id"]}"')
        if api.store.nodes[a.node_id].status == "down":
            raise NomadError(404, "No path to node")
        data = a.files.get(path)
    if data is None:
        raise NomadError(404, f"stat {path}: no such file or directory")
    return Response(text=data, headers={"Content-Type": "text/plain"})


ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(r"/v1/client/metadata"), {"GET": read_meta, "POST": apply_meta,
                                          "PUT": apply_meta}),
    (re.compile(r"/v1/client/fs/cat/(?P<id>[^/]+)"), {"GET": cat}),
]
