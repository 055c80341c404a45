"""Adding a model without writing YAML: a form, the checks, the YAML it will store.

The form's fields become the YAML an operator would have pasted
(``definition_text``, pure), and that text goes through the same decoder and
the same ``add_model`` as the paste form (``llmgw.admin.actions``), so a model
added here is exactly the model that YAML describes, and the YAML shown is
what is stored.

**Check first.** "Check" is a GET — it changes nothing, so it can be reloaded
and bookmarked — that decodes the definition, runs the source check (is the
source there, reachable from where replicas run) and the model service's own
checks (the catalog stays valid, the scheduler can place a profile of that
many GPUs of that class: ``ModelService.check``), and the planner's memory
check (``reservation_check``: a reservation below what a replica needs is a
warning, as on the CLI). "Add" posts the same fields; it runs the checks
again, since the fleet may have changed since.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import yaml
from litestar import Request, get, post
from litestar.params import FromQuery
from litestar.response import Redirect, Template

from llmgw.admin.actions import Form, done, refused
from llmgw.admin.pages import signed_in
from llmgw.admin.render import page, scaling_text
from llmgw.catalog.decode import decode_model_file
from llmgw.catalog.model import Model
from llmgw.control.actions import add_model
from llmgw.control.context import AppContext, Ctx
from llmgw.errors import LlmgwError

SOURCE = "the guided form"
ENGINES = ("vllm", "llama.cpp")
FIELDS = ("name", "description", "source", "engine", "gpu_class", "gpus", "context",
          "cpu_cores", "memory", "min", "max")
DEFAULTS = {"engine": "vllm", "gpus": "1", "min": "1", "cpu_cores": "8", "memory": "32GiB"}
# Where a decoder or check error's field points, which form field it is about.
FIELD_OF = {"profiles": "gpu_class", "scaling.min": "min", "scaling.max": "max",
            "scaling": "min"}


def _number(raw: str) -> int | str:
    raw = raw.strip()
    return int(raw) if raw.isdigit() else raw


def definition(values: dict[str, str]) -> dict[str, Any]:
    """The model the form describes, as the mapping its YAML holds (fields left empty
    are left out, so the catalog's defaults apply)."""
    cpu = not values.get("gpu_class")
    profile: dict[str, Any] = {"name": "cpu" if cpu else values["gpu_class"]}
    if not cpu:
        profile["gpu_class"] = values["gpu_class"]
    profile["gpus"] = 0 if cpu else _number(values.get("gpus", "") or "1")
    for key in ("context", "cpu_cores"):
        if values.get(key, "").strip():
            profile[key] = _number(values[key])
    if values.get("memory", "").strip():
        profile["memory"] = values["memory"].strip()
    out: dict[str, Any] = {"name": values.get("name", "").strip()}
    if values.get("description", "").strip():
        out["description"] = values["description"].strip()
    out["source"] = values.get("source", "").strip()
    out["engine"] = values.get("engine", "").strip() or "vllm"
    out["profiles"] = [profile]
    scaling: dict[str, Any] = {"min": _number(values.get("min", "") or "1")}
    if values.get("max", "").strip():
        scaling["max"] = _number(values["max"])
    out["scaling"] = scaling
    return out


def definition_text(values: dict[str, str]) -> str:
    return yaml.safe_dump(definition(values), sort_keys=False, allow_unicode=True)


def form_field(error_field: str | None) -> str | None:
    """The form field an error is about (``profiles[0].gpus`` → ``gpus``)."""
    if not error_field:
        return None
    leaf = error_field.rsplit(".", 1)[-1].split("[", 1)[0]
    if leaf in FIELDS:
        return leaf
    return next((f for prefix, f in FIELD_OF.items() if error_field.startswith(prefix)), None)


class Checked:
    """What the checks found: the decoded model, or an error and its field; warnings."""

    def __init__(self) -> None:
        self.model: Model | None = None
        self.error: str | None = None
        self.field: str | None = None
        self.warnings: list[str] = []
        self.passed: list[str] = []


async def run_checks(ctx: AppContext, text: str) -> Checked:
    out = Checked()
    try:
        model = decode_model_file(text, source=SOURCE)
        if ctx.source_check is not None:
            await ctx.source_check(model)
            out.passed.append(f"source {model.source} is there and reachable")
        await ctx.models.check(model)
        out.passed.append("the catalog stays valid and the scheduler can place "
                          f"{'a profile' if len(model.profiles) == 1 else 'its profiles'}")
        if ctx.reservation_check is not None:
            out.warnings = await asyncio.wait_for(ctx.reservation_check(model), 60)
            out.passed.append("the planner sized a replica's memory")
        out.model = model
    except LlmgwError as exc:
        out.error, out.field = exc.message, form_field(exc.field)
    except TimeoutError:
        out.warnings.append("the planner did not size the model within 60 s; adding it "
                            "is not refused for that")
    return out


def _context(ctx: AppContext, values: dict[str, str]) -> dict[str, Any]:
    return {"values": values, "engines": ENGINES,
            "gpu_classes": sorted(ctx.config.gpu_classes), "yaml": definition_text(values),
            "checked": None}


@get("/guided")
async def guided_page(request: Request[Any, Any, Any], ctx: Ctx,
                      check: FromQuery[str] = "", name: FromQuery[str] = "",
                      description: FromQuery[str] = "", source: FromQuery[str] = "",
                      engine: FromQuery[str] = "", gpu_class: FromQuery[str] = "",
                      gpus: FromQuery[str] = "", context: FromQuery[str] = "",
                      cpu_cores: FromQuery[str] = "", memory: FromQuery[str] = "",
                      min: FromQuery[str] = "", max: FromQuery[str] = "") -> Template:
    given = {"name": name, "description": description, "source": source, "engine": engine,
             "gpu_class": gpu_class, "gpus": gpus, "context": context,
             "cpu_cores": cpu_cores, "memory": memory, "min": min, "max": max}
    values = given if check else {**given, **{k: v for k, v in DEFAULTS.items()
                                              if not given[k]}}
    out = _context(ctx, values)
    status = 200
    if check:
        checked = out["checked"] = await run_checks(ctx, out["yaml"])
        status = 400 if checked.error else 200
    return page(request, "console/guided.html", session=signed_in(request), status=status,
                **out)


@post("/guided")
async def guided_add(request: Request[Any, Any, Any], ctx: Ctx,
                     data: Form) -> Template | Redirect:
    values = {k: data.get(k, "") for k in FIELDS}
    try:
        model = decode_model_file(definition_text(values), source=SOURCE)
        added = await add_model(ctx, model, signed_in(request).name)
    except LlmgwError as exc:
        # Back to the filled-in form (its fields ride in the URL, as a check's do), with
        # the problem beside its field.
        return refused(request, "/admin/guided?" + urlencode(values), "guided", values,
                       [(form_field(exc.field) or "", exc.message)])
    final = added.model
    return done(request, f"/admin/models/{final.name}",
                f"added {final.name}; scaling {scaling_text(final.scaling)}",
                kind="warn" if added.warnings else "ok", notes=added.warnings)


route_handlers = [guided_page, guided_add]
