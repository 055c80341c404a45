"""Catalog names: what a model's or an adapter's name may be, and the error saying why not."""

from __future__ import annotations

import re

from llmgw.errors import DefinitionError

# llmgw-<name> must be a valid Nomad job ID and service name, which Nomad
# limits to [a-z0-9-], at most 63 characters, starting and ending alphanumeric
# (docs/nomad-api.md §1.2, "Service.Name"). "llmgw-" takes six of the 63.
NAME_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,55}[a-z0-9])?$")
MAX_NAME = 57


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
