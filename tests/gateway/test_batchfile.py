"""Batch lines, result lines, capability checks and engine rewordings, as pure functions."""

from __future__ import annotations

import json

import msgspec
import pytest

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.gateway.batchfile import (
    BatchError,
    BatchRecord,
    LineSplitter,
    Malformed,
    Request,
    TooLong,
    api,
    error_line,
    output_line,
    parse_line,
)
from llmgw.gateway.batchworker import _Progress
from llmgw.gateway.capabilities import UnsupportedEndpointError, capable_chain, describe
from llmgw.gateway.dialects import for_llama_cpp, needs_rewrite


def lines(data: bytes, step: int, max_line: int = 100) -> list[tuple[int, bytes | str]]:
    splitter = LineSplitter(max_line)
    out = []
    for i in range(0, len(data), step):
        out.extend(splitter.feed(data[i:i + step]))
    out.extend(splitter.finish())
    return [(n, f"too long: {x.size}" if isinstance(x, TooLong) else x) for n, x in out]


@pytest.mark.parametrize("step", [1, 3, 10, 1000])
def test_lines_are_numbered_and_over_long_ones_skipped_not_kept(step: int) -> None:
    """Each line keeps its number wherever the stream is cut; a line past the limit is
    reported with its size, and an unterminated last line still counts."""
    data = b"first\n\n" + b"x" * 250 + b"\nafter\nlast"
    assert lines(data, step) == [(1, b"first"), (2, b""), (3, "too long: 250"),
                                 (4, b"after"), (5, b"last")]


def test_a_splitter_holds_at_most_one_line() -> None:
    """However long the over-long line, the splitter's buffer stays under the limit."""
    splitter = LineSplitter(100)
    for _ in range(1000):
        list(splitter.feed(b"y" * 1000))
        assert len(splitter._buf) <= 100
    assert [type(x) for _, x in splitter.feed(b"\n")] == [TooLong]


def request_line(**fields: object) -> bytes:
    base = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": []}}
    return json.dumps({**base, **fields}).encode()


def test_a_request_line_keeps_its_body_bytes_and_model() -> None:
    """The body is the client's bytes (spelling kept), the model read from it."""
    data = b'{"custom_id":"a","method":"post","url":"/v1/embeddings",' \
           b'"body":{"model":"e","input":[1.50,2]}}'
    parsed = parse_line(7, data)
    assert parsed == Request(custom_id="a", url="/v1/embeddings", method="POST", model="e",
                             body=b'{"model":"e","input":[1.50,2]}')


@pytest.mark.parametrize(("data", "custom_id", "words"), [
    (b"{oops", None, "line 3 is not valid JSON"),
    (request_line(body=None), "a", "body must be a JSON object"),
    (json.dumps({"url": "/v1/x", "body": {}}).encode(), None, "not a batch request"),
    (request_line(body={"messages": []}), "a", "string model"),
    (request_line(body={"model": "m", "stream": True}), "a", "stream is not available"),
])
def test_malformed_lines_say_why_with_their_number(data: bytes, custom_id: str | None,
                                                   words: str) -> None:
    """Each kind of malformed line is reported with its line number and custom_id if known."""
    parsed = parse_line(3, data)
    assert isinstance(parsed, Malformed)
    assert parsed.custom_id == custom_id
    assert words in parsed.message


def test_blank_lines_are_not_requests() -> None:
    """A blank line is skipped (None), not counted as malformed."""
    assert parse_line(1, b"   \r") is None


def test_result_lines_have_openais_shape() -> None:
    """Output lines carry status and body; error lines carry code and message, no response."""
    ok = json.loads(output_line("r1", 200, b'{"choices": [1.0]}'))
    assert set(ok) == {"id", "custom_id", "response", "error"}
    assert ok["custom_id"] == "r1"
    assert ok["response"]["status_code"] == 200
    assert ok["response"]["body"] == {"choices": [1.0]}
    assert ok["id"].startswith("batch_req_")
    text = json.loads(output_line("r2", 502, b"Bad Gateway"))
    assert text["response"]["body"] == "Bad Gateway"
    err = json.loads(error_line(None, "batch_expired", "too late"))
    assert err["response"] is None
    assert err["error"] == {"code": "batch_expired", "message": "too late"}


def test_the_batch_object_has_every_field_openai_clients_read() -> None:
    """api() gives request_counts, errors as a list object, and each timestamp and file id
    once it has a value (OpenAI's schema has no null for them)."""
    record = BatchRecord(id="batch_1", owner="k", endpoint="/v1/embeddings",
                         input_file_id="file-1", completion_window="24h", created_at=5,
                         expires_at=86405, total=3, completed=2, failed=1)
    shown = api(record)
    assert shown["object"] == "batch"
    assert shown["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    later = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
             "cancelling_at", "cancelled_at", "output_file_id", "error_file_id", "errors")
    assert not set(later) & set(shown)
    record.in_progress_at, record.output_file_id = 6, "file-2"
    record.errors = [BatchError(code="invalid_url", message="line 1: …", line=1)]
    shown = api(record)
    assert (shown["in_progress_at"], shown["output_file_id"]) == (6, "file-2")
    assert shown["errors"]["object"] == "list"
    assert shown["errors"]["data"][0]["code"] == "invalid_url"
    assert not {"owner", "done_through", "output_expires_after"} & set(shown)


def test_progress_advances_through_lines_finished_out_of_order() -> None:
    """done_through moves only over an unbroken run of finished lines."""
    progress = _Progress(2, {4})
    assert progress.through == 2
    progress.finish(5)
    assert progress.through == 2
    progress.finish(3)
    assert (progress.through, progress.done) == (5, set())


def model(name: str, caps: list[str] | None, **kw: object) -> Model:
    return convert({"name": name, "upstream": ["http://x:1"], "capabilities": caps, **kw},
                   Model)


def test_a_chain_keeps_only_fallbacks_that_serve_the_endpoint() -> None:
    """The model must serve the path (400 otherwise); fallbacks that do not are dropped."""
    chain = [model("rr", ["rerank"]), model("chat", ["chat"]), model("rr2", ["rerank"])]
    assert [m.name for m in capable_chain(chain, "/v1/rerank")] == ["rr", "rr2"]
    with pytest.raises(UnsupportedEndpointError, match="serves rerank"):
        capable_chain(chain, "/v1/chat/completions")
    assert [m.name for m in capable_chain(chain[1:], "/v1/responses")] == ["chat"]


def test_describe_mentions_translated_responses() -> None:
    """A chat model is said to serve responses by translation; one with responses natively not."""
    assert describe(model("a", ["chat", "embeddings"])) == \
        "chat, embeddings and responses (translated to chat)"
    assert describe(model("b", ["responses"])) == "responses"


def test_llama_cpp_gets_json_object_with_schema_and_nothing_else_changes() -> None:
    """Only response_format and model are rewritten; other values keep their spelling."""
    body = b'{"model":"m","temperature":1.50,"response_format":{"type":"json_schema",' \
           b'"json_schema":{"name":"x","schema":{"type":"object"}}}}'
    assert needs_rewrite("llama.cpp", "/v1/chat/completions", body)
    assert not needs_rewrite("vllm", "/v1/chat/completions", body)
    assert not needs_rewrite("sglang", "/v1/chat/completions", body)
    assert not needs_rewrite("openai", "/v1/chat/completions", body)
    assert not needs_rewrite(None, "/v1/chat/completions", body)
    assert not needs_rewrite("llama.cpp", "/v1/chat/completions", b'{"model":"m"}')
    out = for_llama_cpp(body, "served")
    assert b'"temperature":1.50' in out
    assert msgspec.json.decode(out)["response_format"] == {"type": "json_object",
                                                           "schema": {"type": "object"}}
    assert msgspec.json.decode(out)["model"] == "served"
