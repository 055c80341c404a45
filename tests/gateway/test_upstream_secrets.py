"""An external upstream's credentials never leave the operator's side: not in a tenant's 502,
the ledger, logs or metrics; they can be given as a header instead of in the URL."""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

import pytest

from llmgw.catalog.build import check_model
from llmgw.catalog.model import Model
from llmgw.errors import DefinitionError
from llmgw.redact import redact_url, replica_id, scrub
from tests.gateway.conftest import GatewayFactory, chat_model
from tests.gateway.engine import FakeEngine

PASSWORD = "hunter2-upstream-pw"
SECRET = "sk-secret-in-query-7f3a"
TOKEN = "ghp-token-as-user-91b2"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_secrets(base: str) -> str:
    host = base.split("://", 1)[1]
    return f"http://operator:{PASSWORD}@{host}/?key={SECRET}"


def _leaks(text: str) -> list[str]:
    return [s for s in (PASSWORD, SECRET, TOKEN) if s in text]


def test_redact_masks_passwords_token_users_and_secret_query_values() -> None:
    """Each form of a credential in a URL is masked; harmless parameters stay readable."""
    assert redact_url(f"http://u:{PASSWORD}@h:1/v1?key={SECRET}&revision=main") == \
        "http://u:***@h:1/v1?key=***&revision=main"
    assert redact_url(f"https://{TOKEN}@api.example/v1") == "https://***@api.example/v1"
    assert redact_url(f"https://h/v1?api_key={SECRET}&X-Amz-Signature={SECRET}") == \
        "https://h/v1?api_key=***&X-Amz-Signature=***"
    assert replica_id(f"http://u:{PASSWORD}@10.0.3.17:24117/v1?token={SECRET}") == \
        "10.0.3.17:24117"
    said = f"Cannot connect to host URL('http://u:{PASSWORD}@h/?key={SECRET}') {PASSWORD}"
    assert _leaks(scrub(said, (f"http://u:{PASSWORD}@h/?key={SECRET}",))) == []


async def test_a_502_from_an_upstream_with_credentials_names_it_masked(
        make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture) -> None:
    """"no replica answered: … at http://u:PASSWORD@…" becomes "… at http://u:***@…", and
    neither logs nor /metrics carry the secrets."""
    url = _with_secrets(f"http://127.0.0.1:{_closed_port()}")
    gw = await make_gateway([chat_model("ext", upstream=[url])])
    with caplog.at_level(logging.DEBUG):
        r = await gw.chat("ext")
    assert r.status_code in (502, 503), r.text
    assert _leaks(r.text) == [], r.text
    assert "operator:***@127.0.0.1" in r.text
    assert _leaks(caplog.text) == []
    metrics = await gw.client.get("/metrics")
    assert _leaks(metrics.text) == []


async def test_the_ledger_keeps_a_replica_id_not_the_upstream_url(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]],
        caplog: pytest.LogCaptureFixture) -> None:
    """A request answered by an upstream with credentials in its URL is in the ledger
    under the upstream's host and port only."""
    engine = await engines()
    gw = await make_gateway([chat_model("ext", upstream=[_with_secrets(engine.url)])])
    with caplog.at_level(logging.DEBUG):
        assert (await gw.chat("ext")).status_code == 200
    ledger = gw.gateway.ledger
    assert ledger is not None
    await ledger.flush()
    rows = await gw.store.recent_tokens(0)
    assert rows
    replicas = await _replicas(gw.store)
    assert replicas == [replica_id(engine.url)]
    assert _leaks(caplog.text) == []


async def _replicas(store: object) -> list[str]:
    from llmgw.store.sqlite import SqliteStore

    assert isinstance(store, SqliteStore)
    rows = await store._conn(store._reads).run(
        lambda db: db.execute("SELECT replica FROM usage").fetchall())
    return [r[0] for r in rows]


async def test_upstream_auth_sends_the_environment_variable_as_a_header(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The credential reaches the upstream in the named header; the URL holds none."""
    engine = await engines()
    monkeypatch.setenv("EXT_API_KEY", SECRET)
    model = chat_model("ext", upstream=[engine.url],
                       upstream_auth={"env": "EXT_API_KEY", "header": "X-Api-Key",
                                      "prefix": ""})
    gw = await make_gateway([model])
    assert (await gw.chat("ext")).status_code == 200
    assert engine.headers[-1]["x-api-key"] == SECRET
    monkeypatch.delenv("EXT_API_KEY")
    r = await gw.chat("ext")
    assert r.status_code == 502
    assert "EXT_API_KEY" in r.text
    assert "not set" in r.text


def test_a_masked_upstream_written_back_is_refused_with_the_way_out() -> None:
    """A definition copied from the API (its credential ***) cannot silently replace the
    upstream's URL with a wrong one."""
    with pytest.raises(DefinitionError, match="upstream_auth") as err:
        check_model(Model(name="ext", upstream=["http://u:***@h:1/v1"]), {})
    assert err.value.field == "upstream[0]"
