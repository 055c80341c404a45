"""The source check for a LoRA adapter: its weights can be reached and are an adapter.

An adapter is a directory holding ``adapter_config.json`` (PEFT's file: the
rank ``r``, ``lora_alpha``, ``target_modules``) and the weights. vLLM reads
that file first when it loads one (vllm/lora/peft_helper.py), so a source
without it is refused at add time, naming the field, instead of failing
every request at load time. The reachability half is the models' own check
(``llmgw.weights.check.check_source``); this adds the file.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.source import HfSource, PathSource, UrlSource
from llmgw.errors import DefinitionError
from llmgw.weights import layout
from llmgw.weights.check import check_source

CONFIG = "adapter_config.json"


def _not_an_adapter(adapter: Adapter, where: str) -> DefinitionError:
    return DefinitionError(
        f"source {adapter.source.shown!r}: not a LoRA adapter: no {CONFIG} {where}; give "
        "the directory a PEFT training run saved (adapter_config.json beside the weights)",
        field="source")


async def _url_has(adapter: Adapter, url: str, timeout: float) -> None:  # noqa: ASYNC109
    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout)) as http, \
                http.head(url, allow_redirects=True) as resp:
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DefinitionError(f"source {adapter.source.shown!r}: cannot reach {url}: "
                              f"{exc or type(exc).__name__}", field="source") from None
    if status != 200:
        raise _not_an_adapter(adapter, f"at {url} (HTTP {status})")


async def check_adapter_source(adapter: Adapter, *, mirror: str | None = None,
                               hf_token: str | None = None,
                               timeout: float = 10) -> None:  # noqa: ASYNC109
    """Raise DefinitionError(field="source") unless ``adapter``'s source is reachable and
    holds ``adapter_config.json``."""
    src = adapter.source
    match src:
        case PathSource():
            await check_source(src, mirror=mirror, timeout=timeout)
            path = os.path.join(await asyncio.to_thread(os.path.expanduser, src.path), CONFIG)
            if not await asyncio.to_thread(os.path.isfile, path):
                raise _not_an_adapter(adapter, f"in {os.path.dirname(path)!r}")
        case UrlSource():
            await check_source(src, mirror=mirror, timeout=timeout)
            base = src.url if src.url.endswith("/") else src.url + "/"
            await _url_has(adapter, base + CONFIG, timeout)
        case HfSource() if mirror:
            await check_source(src, mirror=mirror, timeout=timeout)
            base = f"{mirror.rstrip('/')}/{str(layout.mirror_path(src)).rstrip('/')}/"
            await _url_has(adapter, base + CONFIG, timeout)
        case HfSource(repo_id, revision, _):
            # The file itself, asked of the Hub: missing is "not an adapter".
            config = HfSource.of(repo_id, revision, CONFIG)
            try:
                await check_source(config, hf_token=hf_token, timeout=timeout)
            except DefinitionError as exc:
                if "not found" in exc.message.lower() or "404" in exc.message:
                    raise _not_an_adapter(adapter, f"in {repo_id}") from None
                raise
        case _:
            await check_source(src, mirror=mirror, timeout=timeout)
