"""What the admin page shows and does, over plain HTTP against the real app.

Refusals are compared with what the JSON API answers for the same request —
the message ``llmgw ctl`` prints — so page and CLI cannot drift apart.
"""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

import pytest
import yaml
from litestar.testing import AsyncTestClient

from llmgw.admin import pages
from llmgw.control.context import AppContext
from llmgw.control.reservation import reservation_checker
from llmgw.scheduler.base import Fleet
from tests.planner.gguf_headers import gemma_gguf

from .conftest import ADMIN_TOKEN, FleetBackend, cpu_yaml, csrf_of

API = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def form_token(client: AsyncTestClient, path: str = "/admin/add") -> str:
    return csrf_of((await client.get(path)).text)


async def refused(client: AsyncTestClient, path: str, data: dict[str, str]) -> str:
    """POST a form that is refused: the answer is a redirect, and the page it leads to
    (a GET, so it can be reloaded) shows the form as sent with its problems."""
    r = await client.post(path, data=data, follow_redirects=False)
    assert r.status_code == 303, r.text
    page = await client.get(r.headers["location"])
    assert page.status_code == 200
    return page.text


def plain(fragment: str) -> str:
    """The text of an HTML fragment, tags dropped (a number may be marked up)."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def error_text(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page, re.S)
    assert found, f"no #{element_id} on the page"
    return html.unescape(found.group(1)).strip()


async def test_adding_from_yaml_records_who_and_shows_the_scaling_in_force(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """A pasted entry is added as alice, and the next page says so once."""
    r = await admin.post("/admin/add", follow_redirects=False, data={
        "csrf": await form_token(admin), "yaml": cpu_yaml("trial", min_=0)})
    assert r.status_code == 303
    assert r.headers["location"] == "/admin/models/trial"
    page = (await admin.get("/admin/models/trial")).text
    assert "added trial; scaling on demand (max 1, idle 15m)" in page
    assert "by alice" in page
    assert "added trial;" not in (await admin.get("/admin/models/trial")).text  # once
    stored = ctx.models.stored("trial")
    assert stored is not None
    assert stored.added_by == "alice"


async def test_a_reservation_below_the_need_is_added_and_the_flash_says_so(
        admin: AsyncTestClient, ctx: AppContext, tmp_path: Path) -> None:
    """The model is added; the message after adding warns with both numbers, once."""
    gguf = tmp_path / "gemma.gguf"
    gguf.write_bytes(gemma_gguf(tail=0))
    ctx.reservation_check = reservation_checker(embedded=True)
    text = cpu_yaml("trial", source=str(gguf)).replace("memory: 8GiB", "memory: 256MiB")
    r = await admin.post("/admin/add", follow_redirects=False, data={
        "csrf": await form_token(admin), "yaml": text})
    assert r.status_code == 303
    page = (await admin.get("/admin/models/trial")).text
    flash = re.search(r'<div class="flash warn" role="status">(.*?)</div>', page, re.S)
    assert flash, "no warning flash on the page"
    notes = [html.unescape(n) for n in re.findall(r"<li>(.*?)</li>", flash.group(1))]
    assert "added trial; scaling 1 (max 1)" in flash.group(1)
    assert notes == [
        "profile cpu reserves 256.0MiB but one replica needs 1008.7MiB of host memory "
        "(weights 405.2MiB, KV cache for 4096 tokens 72.0MiB, runtime 531.5MiB); raise memory "
        "to at least 1008.7MiB, or lower context"]
    assert "flash warn" not in (await admin.get("/admin/models/trial")).text  # once
    assert ctx.models.stored("trial") is not None


async def test_a_refused_source_is_shown_beside_its_line_and_nothing_is_added(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """The source check runs before adding; its error sits under the source line."""
    text = cpu_yaml("trial", source="hf://typo/Qwen2.5-7B")
    page = await refused(admin, "/admin/add", {"csrf": await form_token(admin), "yaml": text})
    assert 'data-field="source"' in page
    flagged = re.search(r'<li value="(\d+)" class="flagged"><code>([^<]*)</code>', page)
    assert flagged
    assert flagged.group(1) == "2"  # the line after name:
    assert html.unescape(flagged.group(2)) == "source: hf://typo/Qwen2.5-7B"
    assert "does not exist on the Hugging Face Hub" in error_text(page, "field-error")
    assert html.unescape(text) in html.unescape(page)  # what was typed is kept
    assert "trial" not in ctx.models.catalog
    assert ctx.models.stored("trial") is None


async def test_a_decoder_error_names_the_key_path_and_its_line(admin: AsyncTestClient) -> None:
    """A wrong type deep in a profile is reported at profiles[0].gpus, on its own line,
    with the message the CLI's decoder gives."""
    text = cpu_yaml("trial").replace("gpus: 0", "gpus: two")
    page = await refused(admin, "/admin/add", {"csrf": await form_token(admin), "yaml": text})
    assert 'data-field="profiles[0].gpus"' in page
    flagged = re.search(r'class="flagged"><code>([^<]*)</code>', page)
    assert flagged
    assert flagged.group(1).strip() == "gpus: two"
    assert error_text(page, "field-error") == (
        "pasted YAML: profiles[0].gpus: Expected `int`, got `str`")


async def test_adding_a_declared_name_is_refused_with_the_clis_message(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """A model named like a declared one is refused with the API's own words."""
    text = cpu_yaml("prod-chat")
    page = await refused(admin, "/admin/add", {"csrf": await form_token(admin), "yaml": text})
    api = await admin.post("/api/v1/models", json=yaml.safe_load(text), headers=API)
    assert api.status_code == 400
    assert error_text(page, "field-error") == api.json()["error"]["message"]
    assert "edit it there rather than adding a second definition" in page


async def test_scaling_reports_the_scaling_in_force(admin: AsyncTestClient,
                                                     ctx: AppContext) -> None:
    """Scale min 3 with max left empty on a model that never had a max: the page says
    max 3, as the catalog fills it in."""
    await admin.post("/admin/add", data={"csrf": await form_token(admin),
                                         "yaml": cpu_yaml("trial")})
    token = await form_token(admin, "/admin/models/trial")
    r = await admin.post("/admin/models/trial/scale", follow_redirects=False,
                         data={"csrf": token, "min": "3", "max": ""})
    assert r.status_code == 303
    page = (await admin.get("/admin/models/trial")).text
    assert "trial: scaling 3 (max 3)" in page
    assert "3/3 ready" in html.unescape(re.sub(r"<[^>]+>", "", page))
    assert ctx.models.catalog.get("trial").scaling.max == 3  # type: ignore[union-attr]


async def test_a_refused_scale_shows_the_clis_message_next_to_the_form(
        admin: AsyncTestClient) -> None:
    """Scaling a declared model, or max below min, is refused with the API's message."""
    token = await form_token(admin, "/admin/models/prod-chat")
    page = await refused(admin, "/admin/models/prod-chat/scale", {"csrf": token, "min": "5"})
    api = await admin.put("/api/v1/models/prod-chat/scale", json={"min": 5}, headers=API)
    assert api.status_code == 409
    assert error_text(page, "scale-form-problem-1") == api.json()["error"]["message"]

    await admin.post("/admin/add", data={"csrf": token, "yaml": cpu_yaml("trial")})
    page = await refused(admin, "/admin/models/trial/scale",
                         {"csrf": token, "min": "4", "max": "2"})
    api = await admin.put("/api/v1/models/trial/scale", json={"min": 4, "max": 2}, headers=API)
    assert api.status_code == 400
    assert error_text(page, "scale-form-max-error") == api.json()["error"]["message"]
    assert 'value="4"' in page  # what was typed stays in the form

    page = await refused(admin, "/admin/models/trial/scale", {"csrf": token, "min": "many"})
    assert error_text(page, "scale-form-min-error") == "min: 'many' is not a whole number"


async def test_removal_needs_the_confirmation_step(admin: AsyncTestClient,
                                                   ctx: AppContext) -> None:
    """A remove POST that did not come through the confirmation page only leads there."""
    token = await form_token(admin)
    await admin.post("/admin/add", data={"csrf": token, "yaml": cpu_yaml("trial")})
    r = await admin.post("/admin/models/trial/remove", data={"csrf": token},
                         follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/admin/models/trial/remove"
    assert "trial" in ctx.models.catalog
    confirm = (await admin.get("/admin/models/trial/remove")).text
    assert 'name="confirm" value="trial"' in confirm
    r = await admin.post("/admin/models/trial/remove", follow_redirects=False,
                         data={"csrf": token, "confirm": "trial"})
    assert r.status_code == 303
    assert "removed trial" in (await admin.get("/admin/models")).text
    assert "trial" not in ctx.models.catalog


async def test_removing_a_fallback_in_use_is_refused_with_the_clis_message(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """Removing a model another one falls back to is refused, in the API's words."""
    token = await form_token(admin)
    await admin.post("/admin/add", data={"csrf": token, "yaml": cpu_yaml("backup")})
    await admin.post("/admin/add", data={"csrf": token, "yaml": cpu_yaml(
        "trial", extra="fallbacks: [backup]\n")})
    assert "trial" in ctx.models.catalog
    page = await refused(admin, "/admin/models/backup/remove",
                         {"csrf": token, "confirm": "backup"})
    api = await admin.delete("/api/v1/models/backup", headers=API)
    assert api.status_code == 409
    assert error_text(page, "remove-form-problem-1") == api.json()["error"]["message"]
    assert "backup" in ctx.models.catalog


async def test_a_stale_replica_is_flagged_and_a_rollout_clears_it(
        admin: AsyncTestClient, backend: FleetBackend) -> None:
    """A replica started with an older fingerprint is flagged on the model page, its
    fragment and the list; the rollout button asks the scheduler to replace it."""
    token = await form_token(admin)
    await admin.post("/admin/add", data={"csrf": token, "yaml": cpu_yaml("trial", min_=2)})
    backend.stale.add("trial")
    for path in ("/admin/models/trial", "/admin/fragments/models/trial"):
        page = (await admin.get(path)).text
        row = re.search(r'<tr data-replica="trial-0" class="stale">(.*?)</tr>', page, re.S)
        assert row, path
        assert "stale profile" in row.group(1)
        assert '<tr data-replica="trial-1" class="">' in page
    assert "1 replica on a stale profile" in (await admin.get("/admin/fragments/models")).text
    r = await admin.post("/admin/models/trial/rollout", data={"csrf": token})
    assert "replicas of trial are being replaced with profile cpu (sha256:" in r.text
    assert backend.rollouts == ["trial"]
    assert 'class="stale"' not in r.text


async def test_the_list_shows_origin_capacity_waits_and_placement_failures(
        admin: AsyncTestClient, backend: FleetBackend) -> None:
    """Each row says declared or runtime (by whom), waiting for capacity and why, the
    last placement failure, and memory above the reservation."""
    token = await form_token(admin)
    await admin.post("/admin/add", data={"csrf": token, "yaml": cpu_yaml("trial")})
    backend.waiting["prod-chat"] = "no node has 4 free cores right now"
    backend.placement_failures["prod-chat"] = "no node with 2 free NVIDIA H100 80GB HBM3"
    backend.hungry.add("trial")
    page = (await admin.get("/admin/fragments/models")).text
    prod = re.search(r'<tr data-model="prod-chat">(.*?)</tr>', page, re.S)
    trial = re.search(r'<tr data-model="trial">(.*?)</tr>', page, re.S)
    assert prod
    assert trial
    assert "declared" in prod.group(1)
    assert "0/2" in plain(prod.group(1))
    assert "waiting for capacity: no node has 4 free cores right now" in prod.group(1)
    assert "last placement failure: no node with 2 free NVIDIA H100 80GB HBM3" in prod.group(1)
    assert "runtime" in trial.group(1)
    assert "added by alice" in trial.group(1)
    assert "exceeds the 8.0GiB reserved" in trial.group(1)


async def test_a_model_short_of_replicas_says_why_in_the_list_and_on_its_page(
        admin: AsyncTestClient, backend: FleetBackend) -> None:
    """The scheduler's shortfall and a failed deployment show in the row and the fragment."""
    short = ("runs 1 of 2 replicas: Nomad's deployment of job version 3 failed with 1 of 2 "
             "healthy (Failed due to progress deadline)")
    backend.shortfalls["prod-chat"] = short
    backend.deployments_failed["prod-chat"] = "llmgw submitted the job again"
    page = html.unescape((await admin.get("/admin/fragments/models")).text)
    row = re.search(r'<tr data-model="prod-chat">(.*?)</tr>', page, re.S)
    assert row
    assert short in row.group(1)
    assert "llmgw submitted the job again" in row.group(1)
    assert '<li class="ok">' not in row.group(1)
    detail = html.unescape((await admin.get("/admin/fragments/models/prod-chat")).text)
    assert short in detail


async def test_the_fleet_page_lists_pools_and_nodes(admin: AsyncTestClient) -> None:
    """Pools by class and fabric with free GPUs, and each node's free capacity."""
    page = (await admin.get("/admin/fleet")).text
    pool = re.search(r'<tr data-pool="h100-80g/ib-a">(.*?)</tr>', page, re.S)
    node = re.search(r'<tr data-node="cpu-64c-1">(.*?)</tr>', page, re.S)
    assert pool
    assert node
    assert "11 / 16" in plain(pool.group(1))
    assert "79.6GiB" in pool.group(1)
    assert "52 / 64" in plain(node.group(1))
    assert "200.0GiB / 256.0GiB" in node.group(1)
    assert (await admin.get("/admin/fragments/fleet")).status_code == 200


async def test_an_unknown_model_is_a_404_page_with_the_apis_message(
        admin: AsyncTestClient) -> None:
    """A model page for a name not in the catalog says so, as the API does."""
    r = await admin.get("/admin/models/nope")
    api = await admin.get("/api/v1/models/nope", headers=API)
    assert r.status_code == api.status_code == 404
    assert api.json()["error"]["message"] in html.unescape(r.text)
    assert r.headers["content-type"].startswith("text/html")


async def test_the_page_script_and_style_are_served(client: AsyncTestClient) -> None:
    """The one script and stylesheet come from /admin/static, with no session needed."""
    js = await client.get("/admin/static/admin.js")
    css = await client.get("/admin/static/admin.css")
    assert js.status_code == css.status_code == 200
    assert "data-refresh" in js.text
    assert "table.grid" in css.text


async def test_the_admin_root_leads_to_the_models(admin: AsyncTestClient) -> None:
    """/admin itself redirects a signed-in browser to the models page."""
    r = await admin.get("/admin", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/admin/models"


async def test_an_external_model_added_at_runtime_can_be_removed_from_its_page(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """An external (upstream) runtime model's page links to its removal, which works."""
    token = await form_token(admin)
    r = await admin.post("/admin/add", follow_redirects=False, data={
        "csrf": token, "yaml": 'name: ext\nupstream: ["http://10.0.0.5:8000/v1"]\n'})
    assert r.status_code == 303
    page = (await admin.get("/admin/models/ext")).text
    assert 'href="/admin/models/ext/remove"' in page
    assert 'id="scale-form"' not in page  # nothing to scale on an external model
    r = await admin.post("/admin/models/ext/remove", follow_redirects=False,
                         data={"csrf": token, "confirm": "ext"})
    assert r.status_code == 303
    assert "ext" not in ctx.models.catalog


async def test_the_fleet_page_warns_of_a_gpu_class_its_cards_cannot_meet(
        admin: AsyncTestClient, backend: FleetBackend) -> None:
    """The fleet's warnings show as a banner, and on each node they concern."""
    warning = ("gpu class h100-80g declares 81920 MiB per card but gpu-h100-a1 report 81559 "
               "MiB: the device memory constraint (${device.attr.memory} >= 81920 MiB) "
               "excludes it; set gpu_classes.h100-80g.memory to 81559MiB")
    backend.fleet_warnings.append(warning)
    page = html.unescape((await admin.get("/admin/fleet")).text)
    assert f'<p class="banner warn fleet-warning">{warning}</p>' in page
    node = re.search(r'<tr data-node="gpu-h100-a1">(.*?)</tr>', page, re.S)
    assert node
    assert "81559 MiB" in node.group(1)


async def test_the_fleet_page_answers_when_the_scheduler_fails_or_hangs(
        admin: AsyncTestClient, backend: FleetBackend,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that raises an unexpected error, or never answers, gives the fleet
    page and its fragment a banner saying so, not a 500."""
    async def broken() -> Fleet:
        raise ConnectionError("connection refused by 10.0.0.1:4646")

    monkeypatch.setattr(backend, "fleet", broken)
    for path in ("/admin/fleet", "/admin/fragments/fleet"):
        r = await admin.get(path)
        assert r.status_code == 200, path
        assert "fleet could not be read (ConnectionError)" in r.text

    async def hung() -> Fleet:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(backend, "fleet", hung)
    monkeypatch.setattr(pages, "FLEET_TIMEOUT", 0.05)
    r = await admin.get("/admin/fleet")
    assert r.status_code == 200
    assert "the scheduler did not answer within" in r.text


async def test_deeply_nested_yaml_is_refused_with_one_line_and_no_traceback(
        admin: AsyncTestClient, caplog: pytest.LogCaptureFixture) -> None:
    """YAML 500 levels deep is a 400 naming the pasted YAML; nothing is logged for it."""
    text = "name: trial\nsource: " + "[" * 500 + "]" * 500 + "\n"
    page = await refused(admin, "/admin/add", {"csrf": await form_token(admin), "yaml": text})
    assert error_text(page, "field-error").startswith("pasted YAML: not valid YAML (line 2")
    assert "nested more than 64 levels deep" in error_text(page, "field-error")
    assert not [rec for rec in caplog.records if rec.levelno >= 30]


async def test_the_usage_page_draws_tokens_per_group_as_svg(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """Tokens per hour stacked by team, server-rendered; group names are escaped."""
    import time

    from llmgw.store.base import UsageRecord

    now = time.time()
    await ctx.store.record_usage([UsageRecord(
        id=f"r{i}", at=now, key="k", team=team, model="m", replica="r", gpu_class="",
        prompt_tokens=100, cached_tokens=0, completion_tokens=20 * (i + 1), status=200,
        latency=0.1, ttft=None) for i, team in enumerate(["ml", "<script>x</script>", "ml"])])
    r = await admin.get("/admin/usage")
    assert r.status_code == 200
    page = r.text
    svg = page[page.index("<svg xmlns"):page.index("</svg>", page.index("<svg xmlns"))]
    assert 'data-group="ml"' in svg
    assert "<script>x</script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in svg
    assert "ml: 280 tokens" in svg
    totals = re.search(r'<tr data-group="ml">(.*?)</tr>', page, re.S)
    assert totals is not None
    assert "<td>2</td>" in re.sub(r"<(?!/?td)[^>]+>", "", totals.group(1))
    by_model = (await admin.get("/admin/usage?by=model&granularity=day")).text
    assert 'data-group="m"' in by_model
    assert "no runtime teams" in (await admin.get("/admin/teams")).text


async def test_teams_and_keys_from_the_admin_page(admin: AsyncTestClient,
                                                  ctx: AppContext) -> None:
    """Create a team with a budget, a key shown once (encrypted in its cookie, never in
    the clear), revoke both by typing their names."""
    from llmgw.tenancy import hash_key

    token = await form_token(admin, "/admin/teams")
    r = await admin.post("/admin/teams", follow_redirects=False, data={
        "csrf": token, "name": "ml", "models": "prod-chat", "tokens_per_day": "5000",
        "priority": "batch", "log_requests": "metadata", "cost_per_day": "12.5"})
    assert r.status_code == 303, r.text
    page = (await admin.get("/admin/teams")).text
    assert "created team ml" in page
    assert "models prod-chat; tokens per day 5,000; priority batch" in page
    page = await refused(admin, "/admin/teams", {"csrf": token, "name": "web",
                                                  "tokens_per_day": "0"})
    assert "tokens_per_day 0 must be a whole number of at least 1" in error_text(
        page, "team-form-tokens_per_day-error")
    r = await admin.post("/admin/keys", follow_redirects=False,
                         data={"csrf": token, "name": "ml-ci", "team": "ml"})
    assert r.status_code == 303
    cookies = r.headers.get_list("set-cookie")
    page = (await admin.get(r.headers["location"])).text
    key = re.search(r'<code class="key" id="new-key-value">([^<]+)</code>', page)
    assert key is not None
    _, stored = await ctx.store.tenants()
    assert [k.sha256 for k in stored] == [hash_key(key.group(1))]
    assert all(key.group(1) not in c for c in cookies)
    assert key.group(1) not in (await admin.get("/admin/teams")).text  # shown once
    page = await refused(admin, "/admin/teams/ml/revoke", {"csrf": token, "confirm": "nope"})
    assert "type the team's name, ml" in error_text(page, "revoke-team-ml-problem-1")
    page = await refused(admin, "/admin/keys/ml-ci/revoke", {"csrf": token})
    assert "type the key's name, ml-ci" in error_text(page, "revoke-key-ml-ci-problem-1")
    assert len((await ctx.store.tenants())[1]) == 1
    r = await admin.post("/admin/keys/ml-ci/revoke", follow_redirects=False,
                         data={"csrf": token, "confirm": "ml-ci"})
    assert r.status_code == 303
    r = await admin.post("/admin/teams/ml/revoke", follow_redirects=False,
                         data={"csrf": token, "confirm": "ml"})
    assert r.status_code == 303
    assert await ctx.store.tenants() == ([], [])


async def test_a_refused_team_form_keeps_every_field_and_lists_every_problem(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """Three wrong fields, one of them an allow-list naming a model the catalog does not
    serve: nothing is created, each problem sits beside its field, and every value typed
    is still in the form."""
    token = await form_token(admin, "/admin/teams")
    page = await refused(admin, "/admin/teams", {
        "csrf": token, "name": "research", "models": "prod-chat, prod-chta",
        "rpm": "lots", "tokens_per_day": "200000", "cost_per_month": "-3"})
    assert await ctx.store.tenants() == ([], [])
    assert "'prod-chta' is not in the catalog" in error_text(page, "team-form-models-error")
    assert "'lots' is not a whole number" in error_text(page, "team-form-rpm-error")
    assert "cost_per_month -3.0 must be more than 0" in error_text(
        page, "team-form-cost_per_month-error")
    assert "3 problems" in page
    for name, value in (("name", "research"), ("models", "prod-chat, prod-chta"),
                        ("rpm", "lots"), ("tokens_per_day", "200000")):
        assert re.search(rf'id="team-form-{name}" name="{name}" type="text" '
                         rf'value="{re.escape(value)}"', page), name
    api = await admin.post("/api/v1/teams", headers=API, json={
        "name": "research", "limits": {"models": ["prod-chta"]}})
    assert api.status_code == 409
    assert "'prod-chta' is not in the catalog" in api.json()["error"]["message"]


async def test_the_models_page_lists_adapters_with_their_base_and_origin(
        admin: AsyncTestClient, tmp_path: Path) -> None:
    """An adapter added through the API shows on the models page, linked to its base."""
    base = {"name": "qwen", "source": "/models/qwen", "engine": "vllm", "lora": {},
            "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": 2, "memory": "8GiB"}]}
    assert (await admin.post("/api/v1/models?skip_source_check=true", json=base,
                             headers=API)).status_code == 200
    r = await admin.post("/api/v1/adapters?skip_source_check=true", headers=API, json={
        "name": "qwen-sql", "base": "qwen", "source": str(tmp_path), "rank": 8,
        "pinned": True, "description": "Text to SQL"})
    assert r.status_code == 200, r.text
    page = (await admin.get("/admin/models")).text
    row = re.search(r'<tr data-adapter="qwen-sql">(.*?)</tr>', page, re.S)
    assert row, "no adapter row on the models page"
    text = row.group(1)
    assert 'href="/admin/models/qwen"' in text
    assert "pinned" in text
    assert "Text to SQL" in text
    assert "added by alice" in text
