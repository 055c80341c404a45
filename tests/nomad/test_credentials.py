"""No secret in a job, a path or a command line: credentials reach tasks through Variables."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.decode import encode
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.source import Source
from llmgw.config import NomadConfig
from llmgw.errors import DefinitionError
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad.render import render_job, spec_hash
from llmgw.store import open_store
from llmgw.testing.fake_nomad import FakeNomad

from .conftest import MIRROR, applied, catalog, config, cpu_model, eventually, make_backend

SECRET_URL = "http://reader:s3cr%40t@mirror.internal:8070/embed/q8_0/embed.gguf"


def _with_source(url: str, name: str = "embed"):
    return msgspec.structs.replace(cpu_model(name), source=Source.parse(url))


def test_a_source_password_is_in_no_job_path_or_command_line():
    """The rendered job, the cache path and --model carry no password, and the fetch task
    reads it from the job's Variable through an env template."""
    m = _with_source(SECRET_URL)
    job = render_job(m, m.profiles[0], NomadConfig(), {}, 1, MIRROR)
    text = js.encode(js.JobRegisterRequest(Job=job)).decode()
    assert "s3cr" not in text
    assert "reader" not in text
    fetch = next(t for t in job.TaskGroups[0].Tasks if t.Name == "fetch")
    engine = next(t for t in job.TaskGroups[0].Tasks if t.Name == "engine")
    dest = "/llmgw-cache/mirror.internal_8070/embed/q8_0/embed.gguf"
    assert fetch.Config["args"][:3] == ["fetch",
                                        "http://mirror.internal:8070/embed/q8_0/embed.gguf", dest]
    assert engine.Config["args"][:2] == ["--model", dest]
    [tmpl] = fetch.Templates
    assert tmpl.Envvars
    assert tmpl.ChangeMode == "noop"
    assert 'nomadVar "nomad/jobs/llmgw-embed"' in tmpl.EmbeddedTmpl
    assert "LLMGW_FETCH_USERINFO={{ .LLMGW_FETCH_USERINFO }}" in tmpl.EmbeddedTmpl


def test_rotating_a_password_changes_neither_fingerprint_nor_job():
    """Two passwords for one source: same fingerprint, same spec hash, same job."""
    a = _with_source(SECRET_URL)
    b = _with_source(SECRET_URL.replace("s3cr%40t", "r0tated"))
    assert fingerprint(a, a.profiles[0]) == fingerprint(b, b.profiles[0])
    ja = render_job(a, a.profiles[0], NomadConfig(), {}, 1, MIRROR)
    jb = render_job(b, b.profiles[0], NomadConfig(), {}, 1, MIRROR)
    assert spec_hash(ja) == spec_hash(jb)
    assert js.encode(ja) == js.encode(jb)


def test_a_mirror_password_stays_out_of_hub_jobs():
    """An hf:// model fetched from a mirror behind a password: the URL in the job has no
    userinfo, and the fetch task reads it from the Variable."""
    m = _with_source("hf://org/repo@v1/model.gguf")
    job = render_job(m, m.profiles[0], NomadConfig(), {}, 1, "https://u:pw@mirror:8070")
    text = js.encode(job).decode()
    assert "pw@" not in text
    assert "u:" not in text
    fetch = next(t for t in job.TaskGroups[0].Tasks if t.Name == "fetch")
    assert fetch.Config["args"][1] == "https://mirror:8070/org--repo/v1/model.gguf"
    assert fetch.Templates


def test_the_stored_definition_holds_the_password_masked():
    """What the store, the API and the admin page are given is user:***@."""
    m = _with_source(SECRET_URL)
    assert b"s3cr" not in encode(m)
    assert json.loads(encode(m))["source"] == \
        "http://reader:***@mirror.internal:8070/embed/q8_0/embed.gguf"


async def test_the_fetch_task_gets_the_password_from_its_variable_and_rotation_keeps_the_job(
        fake: FakeNomad):
    """Against the fake: llmgw writes the Variable before the job, the fetch task's
    template renders the password into its environment under its workload identity,
    the job Nomad holds has none, and a rotated password rewrites the Variable only."""
    m = _with_source(SECRET_URL)
    backend = make_backend(fake, cfg=config(fake, [m]))
    await backend.start()
    try:
        await applied(backend, catalog(m))
        fake.settle()
        [alloc] = await eventually(lambda: fake.allocations("llmgw-embed"), what="placement")
        assert fake.task_env(alloc.id, "fetch") == {"LLMGW_FETCH_USERINFO": "reader:s3cr%40t"}
        assert "s3cr" not in json.dumps(fake.job("llmgw-embed"))
        version = fake.job("llmgw-embed")["Version"]
        rotated = _with_source(SECRET_URL.replace("s3cr%40t", "r0tated"))
        await applied(backend, catalog(rotated))
        assert fake.variable("nomad/jobs/llmgw-embed") == {
            "LLMGW_FETCH_USERINFO": "reader:r0tated"}
        assert fake.job("llmgw-embed")["Version"] == version
        assert [a.id for a in fake.allocations("llmgw-embed")] == [alloc.id]
    finally:
        await backend.close()


async def test_a_masked_password_nomad_does_not_hold_is_refused_at_add(fake: FakeNomad):
    """A definition written back with user:***@ for a job whose Variable is missing is
    refused with the way out, not registered to wait on the template forever."""
    m = _with_source("http://reader:***@mirror.internal:8070/embed/q8_0/embed.gguf")
    backend = make_backend(fake, cfg=config(fake, [m]))
    try:
        with pytest.raises(DefinitionError, match="password in the URL"):
            await backend.check_placement(m, catalog(m))
        assert fake.job("llmgw-embed") is None
    finally:
        await backend.close()


async def test_a_sqlite_store_is_readable_by_its_owner_only(tmp_path: Path):
    """The database file (and its WAL) is created 0600 whatever the umask."""
    old = os.umask(0o022)
    try:
        store = open_store(f"sqlite:///{tmp_path / 'llmgw.db'}")
        await store.open()
        try:
            await store.models()
        finally:
            await store.close()
    finally:
        os.umask(old)
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name


def test_llmgw_fetch_puts_the_environment_password_back_into_the_url():
    """LLMGW_FETCH_USERINFO joins a URL without userinfo, in memory only; a URL with its
    own keeps it."""
    from llmgw.weights.fetch import with_userinfo

    assert with_userinfo("http://m:8070/a/", "reader:s3cr%40t") == \
        "http://reader:s3cr%40t@m:8070/a/"
    assert with_userinfo("http://u:p@m/a", "reader:x") == "http://u:p@m/a"
    assert with_userinfo("http://m/a", None) == "http://m/a"


def test_the_prefetch_of_a_model_with_credentials_reads_them_from_its_own_path():
    """A prefetch job's ID makes a valid Variable path (nomad/structs/variables.go
    validVariablePath: no dots) outside the llmgw-<model> prefix; its fetch task reads the
    password there with its workload identity, under the shipped policy."""
    import re as _re

    from llmgw.scheduler.nomad import credentials, warmth
    from llmgw.scheduler.nomad.caches import CacheKeeper
    from llmgw.scheduler.nomad.client import NomadClient
    from llmgw.testing.fake_nomad import default_fleet

    from .shapes import GPU_CLASSES
    from .test_acl_policy import POLICY_FILE, documented_apply

    m = _with_source(SECRET_URL)
    jid = warmth.prefetch_job_id(m.name)
    assert "." not in jid
    assert not jid.startswith("llmgw-")
    assert _re.fullmatch(r"[a-zA-Z0-9\-_~/]{1,128}", credentials.variable_path(jid))
    with FakeNomad(default_fleet(), acl_token="root", namespaces=("default", "llm")) as fake:
        name, flags = documented_apply()
        fake.apply_policy(name, POLICY_FILE.read_text(), **flags)
        cfg = config(fake, [m], namespace="llm", token=fake.create_token([name]))
        client = NomadClient(cfg.scheduler.nomad)
        keeper = CacheKeeper(client, cfg.scheduler.nomad, GPU_CLASSES, MIRROR,
                             credentials.Keeper(client, cfg.scheduler.nomad, MIRROR))
        try:
            keeper.prefetch(m, None, 1, views=None)
            fake.settle()
            [a] = fake.allocations(jid, namespace="llm")
            env = fake.task_env(a.id, "fetch")
            assert env[credentials.FETCH_USERINFO] == "reader:s3cr%40t"
        finally:
            client.close()


def test_an_invalid_variable_path_is_a_400_as_nomad_answers_it(fake: FakeNomad):
    """nomad/variables_endpoint.go Apply codes ValidatePath's refusal 400, not 500."""
    import httpx

    r = httpx.put(f"{fake.address}/v1/var/nomad/jobs/llmgw.prefetch.embed",
                  json={"Items": {"k": "v"}})
    assert (r.status_code, r.text) == (400, 'invalid path "nomad/jobs/llmgw.prefetch.embed"')


def test_one_models_failed_prefetch_is_recorded_and_the_others_are_kept(fake: FakeNomad):
    """A model whose prefetch cannot start (its Variable lacks the password its masked
    source names) records why, and the next model's prefetch still starts."""
    from llmgw.catalog.model import Scaling
    from llmgw.scheduler.nomad import credentials, warmth
    from llmgw.scheduler.nomad.caches import CacheKeeper
    from llmgw.scheduler.nomad.client import NomadClient

    from .shapes import GPU_CLASSES

    masked = msgspec.structs.replace(
        _with_source("http://reader:***@mirror.internal:8070/a/q8_0/a.gguf", "a"),
        scaling=Scaling(min=0, prefetch=1))
    fine = msgspec.structs.replace(cpu_model("b"), scaling=Scaling(min=0, prefetch=1))
    cfg = config(fake, [masked, fine])
    client = NomadClient(cfg.scheduler.nomad)
    keeper = CacheKeeper(client, cfg.scheduler.nomad, GPU_CLASSES, MIRROR,
                         credentials.Keeper(client, cfg.scheduler.nomad, MIRROR))
    try:
        keeper.observe(catalog(masked, fine))
        fake.settle()
        assert fake.allocations(warmth.prefetch_job_id("b"))
        assert "password" in keeper.prefetch_errors["a"]
        assert "b" not in keeper.prefetch_errors
    finally:
        client.close()
