"""Following the runtime teams and keys from the store (see ``llmgw.tenancy``).

Each gateway polls ``tenants_version()`` — one primary-key read — every
``POLL_INTERVAL`` and, when it moved, reads the teams and keys again and puts
them in force beside the keys file's (``keys.KeyRing``). A revoked team or key
is therefore refused by every instance within a second of the change.

Once the first read has put the store's keys in force beside the file's, the
follower gives the objects of a store migrated from name owners to the key ids
in force (``Store.claim_legacy_owners``: a no-op once done), and only then
says the keys are ``loaded``: the batch worker waits for it, so it never
judges a batch's owner against a key ring that lacks the runtime keys.
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

    def __init__(self, store: Store, apply: ApplyTenants, interval: float = POLL_INTERVAL,
                 owners: Callable[[], dict[str, str]] | None = None) -> None:
        self.store = store
        self._apply = apply
        self.interval = interval
        self.version: int | None = None
        # The id of each key in force by name, for claiming name-owned objects once.
        self._owners = owners
        self._claimed = owners is None

    def loaded(self) -> bool:
        """Whether the store's keys are in force (and name-owned objects claimed)."""
        return self.version is not None and self._claimed

    async def refresh(self) -> bool:
        """Read the teams and keys again if their version moved; True when replaced."""
        if not self.store.is_open:
            return False
        version = await self.store.tenants_version()
        if version == self.version:
            return False
        teams, keys = await self.store.tenants()
        self._apply(*from_store(teams, keys))
        if not self._claimed and self._owners is not None:
            claimed = await self.store.claim_legacy_owners(self._owners())
            if claimed:
                log.info("gave %d stored response(s), file(s) and batch(es) owned by key names "
                         "to the ids of the keys of those names in force", claimed)
            self._claimed = True
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
