"""The ``ui`` block of a model's Nomad job: what the Nomad UI says about the model.

Someone who opens ``llmgw-qwen2-5-14b-instruct`` in the Nomad UI finds, above the
allocations, what the model is (its catalog description), how it runs (engine,
profile, hardware), where it came from (declared in configuration, or added at run
time and by whom) and links: the model's page on llmgw's admin site, its page on the
Hugging Face Hub, and a dashboard. Pure: built from the catalog and configuration.

**Text people wrote is made plain.** The Nomad UI renders the description as
GitHub-flavoured Markdown with line breaks, then sanitises the HTML
(ui/app/components/job-page/parts/title.js, ``description``: ``marked`` with ``gfm``
and ``breaks``, then DOMPurify). A model's description and the name of whoever added
it are written by people, so a ``[link](…)``, an ``<img>``, a heading or a newline in
them must reach the page as the characters typed, not as markup or a second line.
``plain`` turns every run of whitespace (newlines included) into one space, drops
control and format characters (a right-to-left override would reorder what follows),
and puts a backslash before each character Markdown or HTML gives meaning to inline
(GFM renders ``\\*`` as ``*``) and before one that would open a block at the start
of a line. Bare URLs stay URLs (GFM links them): that is what a reader wants of one.
The line breaks in the description are llmgw's own, one per fact.

**Bounded.** Nomad refuses a job whose description exceeds 1,000 bytes
(nomad/structs/structs.go ``Job.Validate``, ``MaxDescriptionCharacters``, measured
with Go's ``len``: bytes, not characters). The facts llmgw writes are short and
bounded; the model's description gets what is left, at most ``DESCRIPTION_BYTES``,
cut on a character boundary and marked with an ellipsis.

**Never a restart.** The block is left out of the profile fingerprint and of the spec
hash the reconciler compares (``render.spec_hash``): a new description or link is
not a stale profile. Nomad's test for a destructive update reads task groups, tasks
and the job's meta, affinities and spreads, never ``Job.UI`` (scheduler/util.go
``tasksUpdated``), so the reconciler applies a changed block by registering the same
spec again, which updates every allocation in place (``reconcile``).
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

import msgspec

from llmgw.catalog.build import Provenance
from llmgw.catalog.model import Model, Profile
from llmgw.catalog.source import HfSource
from llmgw.catalog.units import format_size
from llmgw.config import ServerConfig
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad import wire

# Nomad's limit on Job.UI.Description, in bytes (nomad/structs/structs.go Job.Validate).
MAX_DESCRIPTION = 1000
# The most of that a model's own description takes; the facts below it need the rest.
DESCRIPTION_BYTES = 600
# A name (who added a model, a profile, a gpu class) longer than this is cut.
NAME_BYTES = 64
ELLIPSIS = "…"
ENGINE_NAMES = {"vllm": "vLLM", "llama.cpp": "llama.cpp server"}

# What opens a block at the start of a line besides what _MARKUP escapes anywhere: a
# heading, a list item, a setext underline.
_BLOCK_START = frozenset("#+-=")
_ORDERED_ITEM = re.compile(r"^(\d{1,9})([.)])")
_SPACE = re.compile(r"\s+")


class Links(msgspec.Struct, frozen=True, kw_only=True):
    """The configured places a job links to (``public_url``, ``dashboard_url``)."""

    public_url: str | None = None
    dashboard_url: str | None = None

    @classmethod
    def of(cls, config: ServerConfig) -> Links:
        return cls(public_url=config.public_url, dashboard_url=config.dashboard_url)


def _visible(text: str) -> str:
    """Whitespace runs as one space; control and format characters (Unicode Cc, Cf:
    NUL, escape, bidirectional overrides, zero-width joiners) removed."""
    if not text.isprintable():   # the common case, printable text, skips the walk
        text = "".join(" " if ch.isspace() else ch for ch in text
                       if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf"))
    return _SPACE.sub(" ", text).strip()


# What Markdown or HTML reads as markup inside a line: code, emphasis, links and
# images, tags and entities, strikethrough, table cells, quotes. An underscore between
# two letters or digits (``q8_0``) can neither open nor close emphasis in CommonMark,
# so it stays as written; any other is escaped.
_MARKUP = re.compile(r"[\\`*\[\]<>&~|]|(?<![^\W_])_|_(?![^\W_])")


def _escape(text: str) -> str:
    out = _MARKUP.sub(lambda m: "\\" + m.group(), text)
    if text[:1] in _BLOCK_START:
        out = "\\" + out
    ordered = _ORDERED_ITEM.match(out)
    if ordered:   # "1." or "2)" would open a numbered list
        out = f"{ordered.group(1)}\\{out[ordered.end(1):]}"
    return out


def plain(text: str, budget: int) -> str:
    """``text`` as one line of literal text in GitHub-flavoured Markdown, at most
    ``budget`` bytes of UTF-8 (cut with an ellipsis when longer)."""
    text = _visible(text)
    out = _escape(text)
    if len(out.encode()) <= budget:
        return out
    # Cut the text, not its escaped form, so no escape is split from its character.
    room = budget - len(ELLIPSIS.encode())
    low, high = 0, len(text)
    while low < high:   # the longest prefix whose escaped form fits
        mid = (low + high + 1) // 2
        if len(_escape(text[:mid].rstrip()).encode()) <= room:
            low = mid
        else:
            high = mid - 1
    return _escape(text[:low].rstrip()) + ELLIPSIS


def _hardware(profile: Profile) -> str:
    if profile.gpus > 0:
        noun = "GPU" if profile.gpus == 1 else "GPUs"
        gpu = f"{profile.gpus} {plain(profile.gpu_class or '', NAME_BYTES)} {noun}".replace(
            "  ", " ")
        if profile.fabric:
            gpu += f" on fabric {plain(profile.fabric, NAME_BYTES)}"
        return gpu
    memory = f", {format_size(int(profile.memory))} memory" if profile.memory else ""
    cores = f"{profile.cpu_cores} CPU cores" if profile.cpu_cores else "CPU"
    return cores + memory


def facts(model: Model, profile: Profile, origin: Provenance) -> list[str]:
    """The lines llmgw states about the model, each already plain."""
    engine = ENGINE_NAMES.get(model.engine or "", model.engine or "")
    quant = f", {plain(profile.quantization, NAME_BYTES)}" if profile.quantization else ""
    lines = [
        f"Model {model.name} on {engine}, profile {plain(profile.name, NAME_BYTES)}: "
        f"{_hardware(profile)}{quant}, {profile.context}-token context.",
    ]
    if origin.origin == "runtime":
        who = plain(origin.added_by, NAME_BYTES) if origin.added_by else "an unknown user"
        lines.append(f"Added at run time by {who}.")
    else:
        lines.append("Declared in the server configuration.")
    lines.append("Managed by llmgw: change it with llmgw ctl or its admin site, not here.")
    return lines


def description(model: Model, profile: Profile, origin: Provenance) -> str:
    """The job's description: the model's own, then llmgw's facts, one per line."""
    stated = facts(model, profile, origin)
    used = sum(len(line.encode()) + 1 for line in stated)
    own = plain(model.description, min(DESCRIPTION_BYTES, MAX_DESCRIPTION - used))
    return "\n".join([own, *stated] if own else stated)


def links(model: Model, configured: Links) -> list[js.JobUILink]:
    """The admin page (with a public URL), the Hub page (for hf://), the dashboard
    (when configured); none is ever invented from what is not configured."""
    out = []
    if configured.public_url:
        base = configured.public_url.rstrip("/")
        out.append(js.JobUILink(Label="llmgw admin", URL=f"{base}/admin/models/{model.name}"))
    if isinstance(model.source, HfSource):
        out.append(js.JobUILink(Label="Hugging Face", URL=model.source.page))
    if configured.dashboard_url:
        out.append(js.JobUILink(Label="Dashboard", URL=configured.dashboard_url.replace(
            "{model}", quote(model.name, safe=""))))
    return out


def ui_block(model: Model, profile: Profile, configured: Links,
             origin: Provenance) -> js.JobUIConfig:
    return js.JobUIConfig(Description=description(model, profile, origin),
                          Links=links(model, configured))


def key(ui: js.JobUIConfig | None) -> str:
    """What a registered block is compared by (``registered_key`` of Nomad's answer)."""
    if ui is None:
        return ""
    return _key(ui.Description, [(link.Label, link.URL) for link in ui.Links])


def registered_key(ui: wire.JobUI | None) -> str:
    """The key of the block a job has in Nomad: ``Url`` there, and no links as null."""
    if ui is None:
        return ""
    return _key(ui.Description, [(link.Label, link.Url) for link in ui.Links or ()])


def _key(text: str, pairs: list[tuple[str, str]]) -> str:
    return msgspec.json.encode([text, pairs]).decode()
