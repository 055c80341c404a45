"""The fetch task can write the node's cache: it runs as a declared user, and every set-up
path creates the cache directory owned by that user.

Nomad never creates or chowns a host volume's path (client/client.go ``setupNode`` only
stats it), so the uid on the task and the owner in the docs must be one and the same.
The fake models the directory's owner (llmgw.testing.fake_nomad.volumes).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from llmgw.config import NomadConfig
from llmgw.testing.fake_nomad import FakeNomad, node_cpu_64c
from llmgw.testing.fake_nomad.records import HostVolume

from .conftest import applied, catalog, config, cpu_model, make_backend

ROOT = Path(__file__).resolve().parents[2]
USER = NomadConfig().fetch_user
SETUP = re.compile(r"install -d -o (\d+) -g (\d+) -m 0?755 /var/lib/llmgw/model-cache")


def _owned(owner: int) -> object:
    node = node_cpu_64c("cpu-01")
    path = node.host_volumes["llmgw-model-cache"].path
    return msgspec.structs.replace(node, host_volumes={
        "llmgw-model-cache": HostVolume(path=path, owner=owner, mode=0o755)})


async def test_the_fetch_runs_as_the_declared_user_whatever_the_images_user() -> None:
    """On a node set up as the README says (the cache owned by the fetch user), a replica's
    fetch writes the cache even when the fetcher image's own USER is another uid: the job
    declares the user."""
    m = cpu_model("embed", cores=4)
    with FakeNomad([_owned(int(USER))], image_users={"llmgw:test": 65534}) as fake:
        backend = make_backend(fake, cfg=config(fake, [m], fetcher_image="llmgw:test"))
        await backend.start()
        try:
            await applied(backend, catalog(m))
            fake.settle()
            [a] = fake.allocations("llmgw-embed", include_terminal=True)
            assert a.client_status == "running", a.task_states["fetch"].events
            job = fake.job("llmgw-embed") or {}
            fetch = next(t for t in job["TaskGroups"][0]["Tasks"] if t["Name"] == "fetch")
            assert fetch["User"] == USER
        finally:
            await backend.close()


async def test_a_root_owned_cache_fails_the_fetch_and_the_replica_says_why() -> None:
    """A cache made by `mkdir` as root (mode 0755): the fetch cannot write it, the replica
    fails, and its message names the owner and the uid."""
    m = cpu_model("embed", cores=4)
    with FakeNomad([_owned(0)]) as fake:
        backend = make_backend(fake, cfg=config(fake, [m]))
        await backend.start()
        try:
            await applied(backend, catalog(m))
            fake.settle()
            [r] = await backend.replicas("embed")
            assert r.state == "failed"
            assert f"owned by uid 0, mode 0755; the task runs as uid {USER}" in r.message
        finally:
            await backend.close()


def test_every_set_up_path_makes_the_cache_owned_by_the_fetch_user() -> None:
    """The README, nomad/dev.hcl, both client configurations and docker-compose.yml create
    the directory with `install -d -o <fetch_user>`, never a bare root `mkdir`; the
    Dockerfile's user is that uid."""
    for name in ("README.md", "nomad/dev.hcl", "nomad/client-gpu.hcl", "nomad/client-cpu.hcl",
                 "docker-compose.yml"):
        text = (ROOT / name).read_text()
        found = SETUP.findall(text)
        assert found, f"{name} does not create the cache owned by the fetch user"
        assert {uid for uid, _ in found} == {USER}, name
        assert "mkdir -p /var/lib/llmgw/model-cache" not in text, name
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"--uid {USER}" in dockerfile
    assert "fetch_user" in dockerfile
