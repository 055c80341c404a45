"""Following the runtime teams and keys from the store (see ``llmgw.tenancy``).

Each gateway polls ``tenants_version()`` — one primary-key read — every
``POLL_INTERVAL`` and, when it moved, reads the teams and keys again and puts
them in force beside the keys file's (``keys.KeyRing``). A revoked team or key
is therefore refused by every instance within a second of the change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmgw.errors import LlmgwError
from llmgw.store.base import Store
from llmgw.tenancy import RuntimeKey, RuntimeTeam, from_store

log = logging.getLogger("llmgw.gateway.tenants")

POLL_INTERVAL = 0.5


# Puts decoded teams and keys in force (on the event loop, where requests read them).
ApplyTenants = Callable[[dict[str, RuntimeTeam], list[RuntimeKey]], None]


class TenantsFollower:
    """Keeps a gateway's runtime teams and keys in step with the store."""

    def __init__(self, store: Store, apply: ApplyTenants, interval: float = POLL_INTERVAL) -> None:
        self.store = store
        self._apply = apply
        self.interval = interval
        self.version: int | None = None

    async def refresh(self) -> bool:
        """Read the teams and keys again if their version moved; True when replaced."""
        if not self.store.is_open:
            return False
        version = await self.store.tenants_version()
        if version == self.version:
            return False
        teams, keys = await self.store.tenants()
        self._apply(*from_store(teams, keys))
        self.version = version
        return True

    async def run(self) -> None:
        failing = False     # logged once when reading starts failing, and once when it heals
        while True:
            try:
                await self.refresh()
                if failing:
                    log.info("reading teams and keys works again")
                failing = False
            except LlmgwError as exc:
                if not failing:
                    log.warning("reading teams and keys failed; keeping those in force until "
                                "it works again: %s", exc.message)
                failing = True
            except Exception:
                log.exception("reading teams and keys failed; keeping those in force")
            await asyncio.sleep(self.interval)
