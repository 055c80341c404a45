"""The control API's Litestar app: one factory, every route under /api/v1 behind
the admin guard, probes outside it.

The app holds no state of its own; it reads the catalog in force from the
model service and the scheduler's view from the backend, both in the
``AppContext`` it is built around. Other faces (the admin page) are mounted
by the server assembly through ``mounts``; this package does not know them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec
from litestar import Litestar, Request, Router, get
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Response
from litestar.template import TemplateConfig

from llmgw import __version__
from llmgw.api import adapters, costs, models, plan, sourcecheck, tenants, usage
from llmgw.api.auth import admin_guard, bearer
from llmgw.api.contract import allowed_methods, tell_the_truth
from llmgw.api.docs import DOCS_PATH, SecurityHeadersMiddleware, VendoredRedoc, redoc_script
from llmgw.api.errors import error_response, exception_handlers
from llmgw.api.typed import TYPE_DECODERS, TYPE_ENCODERS, TypedResponse, TypedValuesSchema
from llmgw.control.context import Ctx
from llmgw.control.identity import identify
from llmgw.errors import BackendUnavailableError, LlmgwError
from llmgw.nesting import check_json_depth
from llmgw.scheduler.base import BackendHealth, Fleet

log = logging.getLogger("llmgw.api")

# A model definition is a few kilobytes; a megabyte is generous and bounds the
# work a single request can cause.
MAX_BODY = 1024 * 1024


@get("/fleet", summary="Nodes and pools of the fleet, with free capacity")
async def fleet(ctx: Ctx) -> Fleet:
    try:
        return await ctx.backend.fleet()
    except LlmgwError:
        raise
    except Exception as exc:
        # Whatever the scheduler's client raised, the caller learns the
        # scheduler is the problem (503), not that llmgw broke (500).
        log.warning("reading the fleet failed", exc_info=exc)
        raise BackendUnavailableError(
            f"the scheduler could not report its fleet ({type(exc).__name__}); "
            "`/readyz` says whether it is reachable") from None


class Health(msgspec.Struct, kw_only=True):
    ok: bool
    catalog_version: int
    models: int
    store: str
    scheduler: BackendHealth
    skipped: dict[str, str]


@get("/healthz", summary="Liveness: the process serves", include_in_schema=True)
async def healthz() -> dict[str, bool]:
    return {"ok": True}


class Readiness(msgspec.Struct, kw_only=True):
    """What /readyz tells anyone: ready or not, and which dependency is the reason."""

    ok: bool
    reason: str | None = None


@get("/readyz", summary="Readiness: the store and the scheduler are reachable")
async def readyz(ctx: Ctx, request: Request[Any, Any, Any]) -> Response[Any]:
    """Ready or not, and the class of reason (``store``, ``scheduler``), for anyone.

    The details — the store's and the scheduler's own error text (database
    host, user and name, Nomad's address), the catalog's version, skipped
    models — are for an admin token only: a load balancer needs none of it,
    and an attacker would learn the topology behind the port.
    """
    backend = ctx.backend.health()
    store_error = ctx.models.store_problem()
    ok = store_error is None and backend.ok
    if identify(ctx.config.admin_token_names(), bearer(request)) is None:
        if ok:
            return Response(Readiness(ok=True))
        reason = "store" if store_error is not None else "scheduler"
        return error_response(503, "not_ready", f"not ready: the {reason} cannot be reached")
    body = Health(
        ok=ok,
        catalog_version=ctx.models.version,
        models=len(ctx.models.catalog),
        store="ok" if store_error is None else store_error,
        scheduler=backend,
        skipped=ctx.models.skipped,
    )
    if body.ok:
        return Response(body)
    reason = store_error or backend.message
    return error_response(503, "not_ready", f"not ready: {reason}")


async def before_request(request: Request[Any, Any, Any]) -> Response[Any] | None:
    """Refuse a body nested too deeply before Litestar's decoder recurses into it (400);
    answer OPTIONS with every method of the path (Litestar's own answer lists only some
    when one path has handlers in two functions)."""
    if request.method in ("POST", "PUT", "PATCH"):
        check_json_depth(await request.body(), source="request body")
    elif request.method == "OPTIONS":
        methods = allowed_methods(request.app, request.scope.get("path_template", ""))
        if methods:
            return Response(content=None, status_code=204, media_type="text/plain",
                            headers={"Allow": ", ".join(methods)})
    return None


def create_app(ctx: Ctx, *, mounts: Sequence[Router] = (),
               template_config: TemplateConfig[JinjaTemplateEngine] | None = None,
               debug: bool = False) -> Litestar:
    """The control API on ``ctx``, with ``mounts`` (another face's routers) beside it."""
    handlers: list[Any] = [*models.route_handlers, *adapters.route_handlers, fleet,
                           *plan.route_handlers,
                           *sourcecheck.route_handlers, *tenants.route_handlers,
                           *usage.route_handlers, *costs.route_handlers]
    api = Router("/api/v1", route_handlers=handlers, guards=[admin_guard],
                 security=[{"bearer": []}])
    app = Litestar(
        route_handlers=[api, healthz, readyz, redoc_script, *mounts],
        middleware=[SecurityHeadersMiddleware],
        template_config=template_config,
        dependencies={"ctx": Provide(lambda: ctx, sync_to_thread=False, use_cache=True)},
        exception_handlers=exception_handlers,
        before_request=before_request,
        request_max_body_size=MAX_BODY,
        type_encoders=TYPE_ENCODERS,
        response_class=TypedResponse,
        type_decoders=TYPE_DECODERS,
        plugins=[TypedValuesSchema()],
        openapi_config=OpenAPIConfig(
            title="llmgw control API",
            version=__version__,
            components=Components(security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer",
                                         description="An admin token"),
            }),
            path=DOCS_PATH,
            render_plugins=[VendoredRedoc()],
        ),
        debug=debug,
    )
    app.state.ctx = ctx
    tell_the_truth(app)
    return app
