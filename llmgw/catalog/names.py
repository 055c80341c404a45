"""Catalog names: what a model's or an adapter's name may be, and the error saying why not."""

from __future__ import annotations

import re

from llmgw.catalog.model import MAX_NAME, NAME_PATTERN
from llmgw.errors import DefinitionError

# The model name rule of ``ModelName`` (which the decoder and the OpenAPI document
# use), for names checked in code and for the message that says what is wrong.
NAME_RE = re.compile(NAME_PATTERN)


def check_name(name: str, what: str = "model name") -> None:
    if NAME_RE.match(name):
        return
    problems = []
    if len(name) > MAX_NAME:
        problems.append(f"is {len(name)} characters long (at most {MAX_NAME})")
    if name[:1] and not name[:1].islower():
        problems.append("must start with a lowercase letter")
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    bad = sorted(set(name) - allowed)
    if bad:
        problems.append(f"contains {''.join(bad)!r} (only lowercase letters, digits and '-')")
    if name.endswith("-"):
        problems.append("must not end with '-'")
    if not name:
        problems.append("is empty")
    detail = "; ".join(problems) or "is not valid"
    raise DefinitionError(
        f"{what} {name!r} {detail}: it becomes the Nomad job and service name llmgw-<name>",
        field="name",
    )


__all__ = ["MAX_NAME", "NAME_RE", "check_name"]
