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
  null value deletes the key from the node's ``Meta`` — a static key included, until
  the agent restarts — and from the dynamic set too unless the key is static, where the
  null is kept so that the removal persists (client/meta_endpoint.go ``NodeMeta.Apply``);
* the answer is ``{"Meta": merged, "Dynamic": dynamic, "Static": static}`` at once, from
  the client's own copy of its node, and so is ``GET /v1/client/metadata``;
* the **servers** learn it later. ``Apply`` only calls ``updateNode``, and the client's
  ``watchNodeUpdates`` re-registers the node when a timer started by the first change
  fires — ``nodeUpdateRetryIntv`` (5 s) plus ``helper.RandomStagger`` of it, so 5–10 s —
  carrying every change made meanwhile (client/client.go ``watchNodeUpdates``,
  ``retryIntv``). Until then ``GET /v1/node/:id`` shows the old ``Node.Meta`` and the
  scheduler places by it (constraints, affinities, the computed class). The fake keeps
  that delay on its clock: ``FakeNomad.advance`` past it lands the update, or a timer in
  real time does.

**Allocation files** (``/v1/client/fs/cat/:alloc_id?path=…``) read a file of the
allocation's directory on its node: ``alloc/`` (shared by its tasks, ``NOMAD_ALLOC_DIR``)
or ``<task>/local/``. It needs ``read-fs`` in the allocation's namespace
(command/agent/fs_endpoint.go, the ``cat/`` case). The fake has no
directories: a test writes a file with ``FakeNomad.write_alloc_file``, as the task would.

**Task logs** (``/v1/client/fs/logs/:alloc_id?task=…&type=stdout|stderr``) read what
logmon wrote of a task's output: ``alloc/logs/<task>.<type>.<n>``, rotated files in
index order (client/fs_endpoint.go ``logsImpl``, the name made in ``blockUntilNextLog``).
The agent refuses a missing task (400 ``must provide task name``), a type other than
stdout or stderr (400 ``must provide log type (stdout/stderr)``) and an origin other than
start or end (400 ``origin must be start or end``); ``origin=end`` counts ``offset``
bytes back from the end of the last file (command/agent/fs_endpoint.go ``Logs``). The
client allows ``read-fs`` or ``read-logs`` (client/fs_endpoint.go ``logs``) and answers
``log entry for task … not found`` when the task wrote nothing. ``plain=true`` answers
the bytes as text/plain; otherwise a stream of frames ``{"Data": base64, "File": …,
"Offset": …}``, one per file here. Only ``follow=false`` is modelled: a followed log
never ends, which is what the fake cannot give a test.
"""

from __future__ import annotations

import base64
import json
import random
import re
import threading
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


# client/client.go: nodeUpdateRetryIntv, and retryIntv's RandomStagger of it.
NODE_UPDATE_INTERVAL_NS = 5_000_000_000


def apply(cluster: Cluster, node: Node, meta: dict[str, str | None]) -> None:
    """Copy ``meta`` over the node's dynamic metadata on its client and start the client's
    re-register timer when none runs; the caller holds the store's lock."""
    if node.static_meta is None:
        node.static_meta = dict(node.meta)
    dynamic = {**node.dynamic_meta, **meta}
    for key, value in meta.items():
        if value is None and key not in node.static_meta:
            del dynamic[key]
    node.dynamic_meta = dynamic
    node.client_meta = merged(node.static_meta, dynamic)
    if not node.meta_due:   # watchNodeUpdates: later changes ride on the pending update
        now = cluster.store.now()
        node.meta_due = now + NODE_UPDATE_INTERVAL_NS + random.randrange(  # noqa: S311
            NODE_UPDATE_INTERVAL_NS)
        timer = threading.Timer((node.meta_due - now) / 1e9,
                                lambda: cluster.submit(lambda: reregister(cluster)))
        timer.daemon = True
        cluster.timers.append(timer)
        timer.start()


def reregister(cluster: Cluster) -> None:
    """Land every node update whose time has come: ``Node.Meta`` becomes the client's."""
    store, changed = cluster.store, False
    with store.cond:
        now = store.now()
        for node in store.nodes.values():
            if not node.meta_due or node.meta_due > now or node.client_meta is None:
                continue
            node.meta_due = 0
            changed |= node.meta != node.client_meta
            node.meta = dict(node.client_meta)
            node.modify_index = store.write("nodes")
    if changed:
        # Node.Meta is part of the computed class (nomad/structs/node_class.go HashInclude):
        # evaluations waiting for a node like this one are tried again.
        cluster.unblock()


def _answer(node: Node) -> Json:
    meta = node.client_meta if node.client_meta is not None else node.meta
    return {"Meta": meta, "Dynamic": node.dynamic_meta or None,
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
            # command/agent/fs_endpoint.go: an ErrNoNodeConn from the server's forward
            # (nomad/structs/errors.go "No path to node") is answered 404.
            raise NomadError(404, "No path to node")
        data = a.files.get(path)
    if data is None:
        raise NomadError(404, f"stat {path}: no such file or directory")
    return Response(text=data, headers={"Content-Type": "text/plain"})


# The spellings Go's strconv.ParseBool takes (strconv/atob.go ``ParseBool``).
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def _flag(req: Request, name: str) -> bool:
    """A boolean query parameter as command/agent/fs_endpoint.go ``Logs`` parses it."""
    raw = req.query.get(name, "")
    if raw == "":
        return False
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise NomadError(400, f"failed to parse {name} field to boolean: strconv.ParseBool: "
                          f'parsing "{raw}": invalid syntax')


_LOG_FILE = re.compile(r"alloc/logs/(?P<task>.+)\.(?P<type>stdout|stderr)\.(?P<n>\d+)")


def logs(api: Api, req: Request) -> Response:
    task, kind = req.query.get("task", ""), req.query.get("type", "")
    if not task:
        raise NomadError(400, "must provide task name")
    follow = _flag(req, "follow")
    plain = _flag(req, "plain")
    if kind not in ("stdout", "stderr"):
        raise NomadError(400, "must provide log type (stdout/stderr)")
    try:
        offset = int(req.query.get("offset") or "0")
    except ValueError:
        raise NomadError(400, "error parsing offset: strconv.ParseInt: parsing "
                              f'"{req.query.get("offset")}": invalid syntax') from None
    origin = req.query.get("origin") or "start"
    if origin not in ("start", "end"):
        raise NomadError(400, "origin must be start or end")
    if follow:
        raise NomadError(400, "the fake Nomad serves logs with follow=false only")
    with api.store.cond:
        a = api.store.allocs.get(req.params["id"])
        if a is None:
            raise NomadError(404, f'Unknown allocation "{req.params["id"]}"')
        if api.store.nodes[a.node_id].status == "down":
            # nomad/client_fs_endpoint.go ``logs``: no server holds the node's connection,
            # so ErrNoNodeConn (nomad/structs/errors.go) is streamed back with code 404.
            raise NomadError(404, "No path to node")
        files = sorted(((int(m["n"]), path, data) for path, data in a.files.items()
                        if (m := _LOG_FILE.fullmatch(path)) and m["task"] == task
                        and m["type"] == kind), key=lambda f: f[0])
    if not files:
        raise NomadError(500, f'log entry for task "{task}" and log type "{kind}" not found')
    # logsImpl: from the start, offset into the first file; from the end, offset back
    # from the end of the files together.
    whole = b"".join(data for _, _, data in files)
    start = max(0, len(whole) - offset) if origin == "end" else min(offset, len(whole))
    if plain:
        return Response(text=whole[start:], headers={"Content-Type": "text/plain"})
    frames, at = [], 0
    for _, path, data in files:
        lo = max(0, start - at)
        if lo < len(data):
            frames.append(json.dumps({"Data": base64.b64encode(data[lo:]).decode(),
                                      "File": path, "Offset": len(data)}))
        at += len(data)
    return Response(text="".join(frames).encode(),
                    headers={"Content-Type": "application/json"})


ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(r"/v1/client/metadata"), {"GET": read_meta, "POST": apply_meta,
                                          "PUT": apply_meta}),
    (re.compile(r"/v1/client/fs/cat/(?P<id>[^/]+)"), {"GET": cat}),
    (re.compile(r"/v1/client/fs/logs/(?P<id>[^/]+)"), {"GET": logs}),
]
