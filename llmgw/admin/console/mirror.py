"""The mirror page: what the weights mirror holds, what the catalog uses, what could go.

Read from the mirror's own listings over HTTP (``llmgw.weights.mirror.listing``)
and the catalog in force, with ``llmgw mirror unused``'s rules for what a
source names (``uses.source_path``). Nothing is removed from here: the
mirror's directory is on the mirror's host and the server is read-only by
design, so each removable directory comes with the ``llmgw mirror remove``
command to run there, which checks the catalog again before it deletes.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response import Template

from llmgw.admin.pages import signed_in
from llmgw.admin.render import page
from llmgw.control.context import Ctx
from llmgw.errors import LlmgwError
from llmgw.weights.mirror.listing import holdings, walk
from llmgw.weights.mirror.uses import Use, source_path


@get("/mirror")
async def mirror_page(request: Request[Any, Any, Any], ctx: Ctx) -> Template:
    base = ctx.config.mirror
    context: dict[str, Any] = {"mirror": base, "mirror_error": None, "held": [],
                               "missing": [], "complete": True, "total": 0, "unused": 0}
    if base is not None:
        uses = []
        for m in ctx.models.catalog:
            if m.source is not None:
                # A local path names nothing on a remote mirror: no root to compare it to.
                path = source_path(m.source.text, "/nonexistent-mirror-root", base)
                if path is not None:
                    uses.append(Use(model=m.name, source=m.source.text, path=path))
        try:
            found = await walk(base)
        except LlmgwError as exc:
            context["mirror_error"] = exc.message
        else:
            held, missing = holdings(found.files, uses)
            context.update(held=held, missing=missing, complete=found.complete,
                           total=sum(h.size for h in held),
                           unused=sum(h.size for h in held if not h.users))
    return page(request, "console/mirror.html", session=signed_in(request), **context)


route_handlers = [mirror_page]
