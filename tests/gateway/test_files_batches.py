"""Files and batches through the `openai` client: upload, run, resume, cancel, expire, fail."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.gateway.keys import add_key
from llmgw.store.base import CHUNK_SIZE
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model, wait_for
from tests.gateway.engine import FakeEngine

CHAT = "/v1/chat/completions"


def line(i: int, model: str = "chat", url: str = CHAT, **body: Any) -> bytes:
    request = {"custom_id": f"req-{i}", "method": "POST", "url": url,
               "body": {"model": model, "messages": [{"role": "user", "content": f"line {i}"}],
                        **body}}
    return json.dumps(request).encode() + b"\n"


def jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in data.splitlines() if x.strip()]


def seen_lines(engine: FakeEngine) -> Counter[str]:
    return Counter(r["messages"][0]["content"] for r in engine.requests if "messages" in r)


async def finished(client: openai.AsyncOpenAI, batch_id: str, timeout: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert loop.time() < deadline, f"batch still {batch.status} after {timeout} s"
        await asyncio.sleep(0.05)


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines, tmp_path: Path
                ) -> tuple[GatewayHandle, openai.AsyncOpenAI, FakeEngine, str]:
    engine = await engines("e")
    keys = tmp_path / "keys.json"
    key = add_key(keys, "alice", ["chat", "embed", "other"])
    other = add_key(keys, "bob")
    gw = await make_gateway([
        chat_model("chat", upstream=[engine.url], served_name="org/chat"),
        chat_model("embed", upstream=[engine.url], capabilities=["embeddings"]),
        chat_model("other", upstream=[engine.url]),
        chat_model("forbidden", upstream=[engine.url]),
    ], keys_file=keys, max_file_size="4MiB")
    client = gw.openai(key)
    return gw, client, engine, other


async def upload(client: openai.AsyncOpenAI, data: bytes, name: str = "in.jsonl") -> str:
    file = await client.files.create(file=(name, io.BytesIO(data)), purpose="batch")
    return file.id


# --- files ------------------------------------------------------------------------------


async def test_a_file_is_uploaded_read_back_whole_and_deleted(setup) -> None:  # type: ignore[no-untyped-def]
    """A file of several store chunks comes back byte for byte, then is gone after delete."""
    gw, client, _, other_key = setup
    data = b"".join(line(i) for i in range(16000))
    assert len(data) > 2 * CHUNK_SIZE
    created = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert (created.bytes, created.filename, created.purpose) == (len(data), "in.jsonl", "batch")
    assert (await client.files.retrieve(created.id)).bytes == len(data)
    assert (await client.files.content(created.id)).content == data
    stranger = gw.openai(other_key)
    with pytest.raises(openai.NotFoundError):
        await stranger.files.retrieve(created.id)
    deleted = await client.files.delete(created.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        await client.files.content(created.id)


async def test_a_file_over_the_limit_is_413_and_leaves_nothing(setup) -> None:  # type: ignore[no-untyped-def]
    """Past gateway.max_file_size the upload is refused with 413 and its chunks removed."""
    gw, client, _, _ = setup
    with pytest.raises(openai.APIStatusError) as err:
        await client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (5 * 1024 * 1024))),
                                  purpose="batch")
    assert err.value.status_code == 413
    assert "max_file_size" in err.value.message
    assert await gw.store.purge_uploads(before=2**62) == 0   # no half-written file left


async def test_a_purpose_other_than_batch_is_refused(setup) -> None:  # type: ignore[no-untyped-def]
    """purpose must be batch: anything else is a 400 naming the field."""
    _, client, _, _ = setup
    with pytest.raises(openai.BadRequestError) as err:
        await client.files.create(file=("a.txt", io.BytesIO(b"x")), purpose="assistants")
    assert err.value.body["param"] == "purpose"  # type: ignore[index]


# --- batches ----------------------------------------------------------------------------


async def test_a_batch_runs_every_line_and_writes_openai_shaped_output(setup) -> None:  # type: ignore[no-untyped-def]
    """validating → in_progress → completed; one output line per request, bodies intact."""
    gw, client, engine, _ = setup
    file_id = await upload(client, b"".join(line(i, temperature=0.5) for i in range(12)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h", metadata={"team": "search"})
    assert batch.status == "validating"
    done = await finished(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
    assert done.error_file_id is None
    assert done.metadata == {"team": "search"}
    assert done.in_progress_at is not None
    assert done.completed_at is not None
    output = jsonl((await client.files.content(done.output_file_id)).content)
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(12)]
    assert output[0]["response"]["status_code"] == 200
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "hello from e"
    assert output[0]["error"] is None
    sent = engine.requests[0]
    assert sent["model"] == "org/chat"
    assert sent["temperature"] == 0.5
    assert seen_lines(engine) == Counter({f"line {i}": 1 for i in range(12)})
    assert gw.gateway.batch_worker.lines_sent == 12


async def test_malformed_lines_fail_alone_and_the_rest_complete(setup) -> None:  # type: ignore[no-untyped-def]
    """Bad JSON, a missing body and stream: true go to the error file; good lines run."""
    _, client, engine, _ = setup
    data = (line(0) + b"{not json\n" + b'{"custom_id": "no-body", "url": "' + CHAT.encode()
            + b'"}\n' + b"\n" + line(4, stream=True) + line(5))
    file_id = await upload(client, data)
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    done = await finished(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts.model_dump() == {"total": 5, "completed": 2, "failed": 3}
    errors = jsonl((await client.files.content(done.error_file_id)).content)
    assert [e["custom_id"] for e in errors] == [None, "no-body", "req-4"]
    assert all(e["response"] is None for e in errors)
    assert "line 2 is not valid JSON" in errors[0]["error"]["message"]
    assert "stream is not available" in errors[2]["error"]["message"]
    output = jsonl((await client.files.content(done.output_file_id)).content)
    assert [o["custom_id"] for o in output] == ["req-0", "req-5"]
    assert seen_lines(engine) == Counter({"line 0": 1, "line 5": 1})


async def test_an_engine_error_goes_to_the_error_file_with_its_response(setup) -> None:  # type: ignore[no-untyped-def]
    """A 4xx from the engine is an error-file line carrying the status and the engine's body."""
    _, client, engine, _ = setup
    engine.fail_status = 422
    file_id = await upload(client, line(0))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    done = await finished(client, batch.id)
    [error] = jsonl((await client.files.content(done.error_file_id)).content)
    assert error["response"]["status_code"] == 422
    assert error["response"]["body"]["error"]["message"] == "e failed on cue"
    assert done.output_file_id is None


async def test_unknown_models_wrong_urls_and_forbidden_models_fail_validation_with_lines(
        setup) -> None:  # type: ignore[no-untyped-def]
    """Validation fails the whole batch, naming each offending line; nothing is sent."""
    _, client, engine, _ = setup
    data = (line(0) + line(1, model="nope") + line(2, url="/v1/completions")
            + line(3, model="forbidden") + line(4, model="embed"))
    file_id = await upload(client, data)
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    done = await finished(client, batch.id)
    assert done.status == "failed"
    assert done.errors is not None
    got = [(e.line, e.code) for e in done.errors.data]
    assert got == [(2, "model_not_found"), (3, "invalid_url"), (4, "model_not_allowed"),
                   (5, "unsupported_endpoint")]
    assert "line 2: model 'nope' does not exist" in done.errors.data[0].message
    assert done.failed_at is not None
    assert engine.requests == []


async def test_an_endpoint_that_cannot_be_batched_is_refused_at_creation(setup) -> None:  # type: ignore[no-untyped-def]
    """endpoint must be one of the batchable paths; the answer names them."""
    _, client, _, _ = setup
    file_id = await upload(client, line(0))
    with pytest.raises(openai.BadRequestError, match="/v1/embeddings") as err:
        await client.batches.create(input_file_id=file_id,
                                    endpoint="/v1/audio/speech",  # type: ignore[arg-type]
                                    completion_window="24h")
    assert err.value.body["param"] == "endpoint"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id="file-missing", endpoint=CHAT,
                                    completion_window="24h")


async def test_cancelling_stops_the_batch_and_keeps_what_finished(setup) -> None:  # type: ignore[no-untyped-def]
    """cancel → cancelling → cancelled; finished lines are in the output, the rest never sent."""
    _, client, engine, _ = setup
    engine.response_delay = 0.2
    file_id = await upload(client, b"".join(line(i) for i in range(200)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    await wait_for(lambda: len(engine.requests) >= 8, what="some lines to run")
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    done = await finished(client, batch.id)
    assert done.status == "cancelled"
    assert done.cancelled_at is not None
    assert 8 <= done.request_counts.completed < 200
    output = jsonl((await client.files.content(done.output_file_id)).content)
    assert len(output) == done.request_counts.completed
    with pytest.raises(openai.ConflictError, match="cancelled"):
        await client.batches.cancel(batch.id)


async def test_a_batch_past_its_window_expires_with_the_rest_in_the_error_file(setup) -> None:  # type: ignore[no-untyped-def]
    """Lines not run when the completion window closes are batch_expired errors."""
    _, client, engine, _ = setup
    engine.response_delay = 0.1
    file_id = await upload(client, b"".join(line(i) for i in range(400)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="2s")  # type: ignore[arg-type]
    done = await finished(client, batch.id)
    assert done.status == "expired"
    assert done.expired_at is not None
    errors = jsonl((await client.files.content(done.error_file_id)).content)
    assert errors
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert done.request_counts.completed + len(errors) == 400


async def test_a_batch_that_expires_before_it_runs_reports_every_line_expired(setup) -> None:  # type: ignore[no-untyped-def]
    """With the worker away past the window, the batch ends expired, all lines in the error
    file as batch_expired, none sent."""
    gw, client, engine, _ = setup
    await gw.gateway.batch_worker.close()
    file_id = await upload(client, b"".join(line(i) for i in range(5)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="1s")  # type: ignore[arg-type]
    await wait_for(lambda: time.time() >= batch.expires_at, what="the window to close")
    gw.gateway.batch_worker.start()
    done = await finished(client, batch.id)
    assert done.status == "expired"
    assert done.request_counts.model_dump() == {"total": 5, "completed": 0, "failed": 5}
    errors = jsonl((await client.files.content(done.error_file_id)).content)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == \
        [(f"req-{i}", "batch_expired") for i in range(5)]
    assert engine.requests == []


async def test_batches_belong_to_their_key_and_are_listed_newest_first(setup) -> None:  # type: ignore[no-untyped-def]
    """Another key cannot see a batch; list pages through the owner's batches."""
    gw, client, _, other_key = setup
    file_id = await upload(client, line(0))
    ids = [(await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")).id for _ in range(3)]
    page = await client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2]
    assert page.has_more is True
    everything = [b.id async for b in await client.batches.list(limit=2)]
    assert everything == ids[::-1]
    stranger = gw.openai(other_key)
    with pytest.raises(openai.NotFoundError):
        await stranger.batches.retrieve(ids[0])
    assert (await stranger.batches.list()).data == []


async def test_a_restarted_worker_resumes_without_resending_finished_lines(
        make_gateway: GatewayFactory, engines) -> None:
    """Stopped half-way and started again on the same store, the batch completes and every
    line that had a result before the stop was sent exactly once."""
    engine = await engines("e")
    engine.response_delay = 0.05
    models = [chat_model("chat", upstream=[engine.url])]
    first = await make_gateway(models)
    client = first.openai()
    file_id = await upload(client, b"".join(line(i) for i in range(60)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    await wait_for(lambda: len(engine.requests) >= 20, what="a third of the lines")
    await first.gateway.batch_worker.close()
    stored = await first.store.batch_result_lines(batch.id, 0)
    assert 15 <= len(stored) < 60
    second = await make_gateway(models)
    client2 = second.openai()
    done = await finished(client2, batch.id)
    assert done.status == "completed"
    assert done.request_counts.completed == 60
    seen = seen_lines(engine)
    assert all(seen[f"line {n - 1}"] == 1 for n in stored)
    assert set(seen) == {f"line {i}" for i in range(60)}
    output = jsonl((await client2.files.content(done.output_file_id)).content)
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(60)]


async def test_two_gateways_run_a_batch_once_between_them(make_gateway: GatewayFactory,
                                                          engines) -> None:
    """With two instances on one store only the lease holder works: each line is sent once."""
    engine = await engines("e")
    models = [chat_model("chat", upstream=[engine.url])]
    a, b = await make_gateway(models), await make_gateway(models)
    client = a.openai()
    file_id = await upload(client, b"".join(line(i) for i in range(40)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    b.gateway.batch_worker.wake()
    done = await finished(client, batch.id)
    assert done.request_counts.completed == 40
    assert seen_lines(engine) == Counter({f"line {i}": 1 for i in range(40)})
    sent = sorted([a.gateway.batch_worker.lines_sent, b.gateway.batch_worker.lines_sent])
    assert sent == [0, 40]


async def test_batch_lines_are_sent_at_the_batch_priority_within_the_concurrency_limit(
        make_gateway: GatewayFactory, engines) -> None:
    """At most gateway.batch_concurrency lines are at the engine at once, each marked batch."""
    engine = await engines("e")
    # The engine holds its answers until the limit is reached, so reaching it does not
    # depend on three requests happening to overlap on a busy CPU; it counts its own
    # peak, which no sampling can miss.
    engine.hold = asyncio.Event()
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])], batch_concurrency=3)
    priorities: list[str] = []
    original = gw.gateway.forwarder.forward

    async def spy(req, chain, send):  # type: ignore[no-untyped-def]
        priorities.append(req.priority)
        return await original(req, chain, send)

    gw.gateway.forwarder.forward = spy  # type: ignore[method-assign]
    client = gw.openai()
    file_id = await upload(client, b"".join(line(i) for i in range(30)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    await wait_for(lambda: engine.in_flight == 3, what="three lines at the engine")
    engine.hold.set()
    assert (await finished(client, batch.id)).status == "completed"
    assert engine.peak_in_flight == 3
    assert priorities == ["batch"] * 30



async def test_files_and_batches_answer_503_while_the_store_is_not_open(
        make_gateway: GatewayFactory, engines) -> None:
    """A store that could not be opened at start-up makes these endpoints 503, not 500."""
    engine = await engines("e")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])])
    await gw.store.close()
    client = gw.openai()
    for call in (client.files.retrieve("file-1"), client.batches.retrieve("batch_1"),
                 client.responses.retrieve("resp_1")):
        with pytest.raises(openai.InternalServerError) as err:
            await call
        assert err.value.status_code == 503
        assert "store is not open" in err.value.message


@pytest.mark.parametrize("journal", [False, True], ids=["no journal", "journal"])
async def test_a_result_that_cannot_be_stored_loses_no_line(
        make_gateway: GatewayFactory, engines, tmp_path: Path, journal: bool) -> None:
    """A store failure while recording a line stops the pass and the output still has every
    line exactly once. Without a journal the next pass runs that line again; with one, the
    answer that came back is stored from the journal, so every line reaches the engine once."""
    engine = await engines("e")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])],
                            **({"journal_dir": str(tmp_path / "journal")} if journal
                               else {"journal": False}))
    original = gw.store.put_batch_results
    calls = 0

    async def flaky(batch_id: str, results: list[Any]) -> None:
        nonlocal calls
        calls += 1
        if calls == 7:
            raise StoreUnavailableError("SQLite database x could not be written; check the disk")
        await original(batch_id, results)

    gw.store.put_batch_results = flaky  # type: ignore[method-assign]
    client = gw.openai()
    file_id = await upload(client, b"".join(line(i) for i in range(20)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    done = await finished(client, batch.id)
    assert done.request_counts.model_dump() == {"total": 20, "completed": 20, "failed": 0}
    output = jsonl((await client.files.content(done.output_file_id)).content)
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(20)]
    assert calls > 7
    if journal:
        assert seen_lines(engine) == Counter({f"line {i}": 1 for i in range(20)})
    else:
        assert sum(seen_lines(engine).values()) == 21


async def test_batch_lines_are_counted_apart_from_clients_requests(
        make_gateway: GatewayFactory, engines) -> None:
    """/metrics counts batch lines in batch_lines_total, not in the clients' requests_total."""
    engine = await engines("e")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])])
    client = gw.openai()
    await client.chat.completions.create(model="chat", messages=[])
    file_id = await upload(client, b"".join(line(i) for i in range(6)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    await finished(client, batch.id)
    metrics = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_batch_lines_total{model="chat",outcome="succeeded"} 6.0' in metrics
    assert 'llmgw_gateway_requests_total{model="chat",status="200"} 1.0' in metrics


async def test_a_responses_batch_answers_responses_and_keeps_them(
        make_gateway: GatewayFactory, engines) -> None:
    """/v1/responses lines are translated for a chat model, passed to a Responses engine, and
    each answer is a Response that can be retrieved afterwards."""
    chat, native = await engines("llama"), await engines("vllm")
    gw = await make_gateway([chat_model("chat", upstream=[chat.url]),
                             chat_model("native", upstream=[native.url],
                                        capabilities=["responses"])])
    client = gw.openai()
    data = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
                                "body": {"model": model, "input": f"question {i}",
                                         "instructions": "Be brief."}}).encode() + b"\n"
                    for i, model in enumerate(["chat", "native", "chat"]))
    file_id = await upload(client, data)
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/responses",
                                        completion_window="24h")
    done = await finished(client, batch.id)
    assert done.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    output = jsonl((await client.files.content(done.output_file_id)).content)
    bodies = [o["response"]["body"] for o in output]
    assert [b["object"] for b in bodies] == ["response"] * 3
    assert [b["output"][0]["content"][0]["text"] for b in bodies] == \
        ["hello from llama", "responded by vllm", "hello from llama"]
    assert chat.requests[0]["messages"] == [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "question 0"}]
    assert native.requests[0]["store"] is False
    kept = await client.responses.retrieve(bodies[0]["id"])
    assert kept.output_text == "hello from llama"


async def test_batch_lines_are_in_the_usage_ledger_as_their_owners(setup) -> None:  # type: ignore[no-untyped-def]
    """Each line is one ledger record of the key that created the batch."""
    gw, client, _, _ = setup
    file_id = await upload(client, b"".join(line(i) for i in range(3)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    assert (await finished(client, batch.id)).status == "completed"
    await gw.gateway.ledger.flush()
    [row] = await gw.store.usage("key", 0, 2**40, day=False)
    assert (row.group, row.requests, row.prompt_tokens, row.completion_tokens) == (
        "alice", 3, 15, 9)


async def test_a_line_refused_for_quota_fails_at_once_and_the_batch_goes_on(
        make_gateway: GatewayFactory, engines) -> None:
    """Past its owner's budget each line fails with insufficient_quota without a retry, and
    the batch runs to its end within moments instead of backing off for minutes."""
    from llmgw.tenancy import Limits
    from tests.gateway.test_tenants import make_key, make_team, until

    engine = await engines("e")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])],
                            listen="0.0.0.0:8080")
    # Room for one line's reservation (its body's bytes and 256 answer tokens) and a few
    # of the fake engine's 8-token answers.
    await make_team(gw.store, "ml", Limits(tokens_per_day=400))
    key = await make_key(gw.store, "k1", "ml")
    client = gw.openai(key)

    async def accepted() -> bool:
        try:
            await client.models.list()
        except openai.AuthenticationError:
            return False
        return True

    await until(accepted, "the key to be followed")
    file_id = await upload(client, b"".join(line(i) for i in range(60)))
    batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                        completion_window="24h")
    # Backing off 1 + 2 + 4 + 8 s per line, four at a time, would take minutes.
    done = await finished(client, batch.id, timeout=45)
    assert done.status == "completed"
    ran = done.request_counts.completed
    assert ran >= 1
    assert ran * 8 <= 400                     # the budget held
    assert done.request_counts.failed == 60 - ran
    assert len(engine.requests) == ran         # nothing sent for a refused line
    errors = jsonl((await client.files.content(done.error_file_id)).content)
    assert len(errors) == 60 - ran
    for e in errors:
        assert e["response"]["status_code"] == 429
        assert e["response"]["body"]["error"]["code"] == "insufficient_quota"
    assert gw.gateway.batch_worker.lines_sent == 60


def test_only_a_quota_refusal_is_final() -> None:
    """A 429 for quota ends a line; one for a rate limit or a full queue is retried."""
    from llmgw.gateway.batchworker import is_final

    quota = b'{"error": {"message": "spent", "type": "insufficient_quota", "code": ' \
            b'"insufficient_quota"}}'
    assert is_final(429, quota)
    assert not is_final(429, b'{"error": {"code": "rate_limit_exceeded"}}')
    assert not is_final(429, b"not json")
    assert not is_final(503, quota)
