"""The add-time memory check: read a model's weights off the event loop, then warn.

Adding a model whose profile reserves less host memory than one replica
needs is allowed, and said: the planner's ``reservation_warnings`` has the
arithmetic, ``read_facts`` reads the weights' description (a GGUF header,
a checkpoint's config.json) from wherever the source points. Reading can
take a few round trips to the Hub or the mirror, so it runs in a thread,
bounded by ``deadline``, while the model is being added.

Nothing here refuses a model. A source that cannot be read, or a profile
the planner cannot size, leaves the add as it was and says why in the log:
whether the source is reachable at all is the source check's question, and
it has already been answered by the time this runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from llmgw.catalog.model import Model
from llmgw.planner.inputs import FactsUnavailableError, read_facts
from llmgw.planner.reserve import reservation_warnings
from llmgw.weights.hub import Hub

log = logging.getLogger("llmgw.control")


def reservation_checker(*, embedded: bool, hub: Hub | None = None, mirror: str | None = None,
                        timeout: float = 10.0,
                        deadline: float = 30.0) -> Callable[[Model], Awaitable[list[str]]]:
    """What ``AppContext.reservation_check`` expects.

    ``embedded``: the embedded scheduler runs the catalog (llama-cpp-python, and
    local paths are files on this machine). ``timeout`` bounds each request,
    ``deadline`` the whole read; ``hub`` defaults to the Hub at HF_ENDPOINT. With a
    ``mirror``, Hub sources are read from the mirror, as the nodes read them.
    """

    async def check(model: Model) -> list[str]:
        if (model.external or model.source is None
                or all(p.memory is None for p in model.profiles)):
            return []
        source = model.source
        try:
            async with asyncio.timeout(deadline):
                facts = await asyncio.to_thread(read_facts, source, hub=hub, local=embedded,
                                                mirror=mirror, timeout=timeout)
        except FactsUnavailableError as exc:
            log.info("model %s: memory reservations not checked: %s", model.name, exc)
            return []
        except TimeoutError:
            log.info("model %s: memory reservations not checked: reading %s took more than "
                     "%gs", model.name, source.shown, deadline)
            return []
        except Exception:  # advice only: a bug here must not fail an add, but is logged
            log.warning("model %s: reading %s for the memory check failed", model.name,
                        source.shown, exc_info=True)
            return []
        result = reservation_warnings(model, facts, embedded=embedded)
        for reason in result.skipped:
            log.info("model %s: memory reservation not checked: %s", model.name, reason)
        for warning in result.warnings:
            log.warning("model %s: %s", model.name, warning)
        return result.warnings

    return check
