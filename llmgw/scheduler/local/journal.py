"""The embedded scheduler's holdings on disk, so a restart of llmgw loses none of them.

Nomad remembers each allocation's life, so the cost meter can always ask it
again; the embedded scheduler is llmgw itself, and what it held is gone with
the process. With ``scheduler.local.state_dir`` set, the backend keeps its
holdings (``scheduler.base.Holding``: cards and cores from reservation to
release) in ``holdings.json`` there: rewritten whole (atomically, by rename)
when one starts or ends, and every ``HEARTBEAT`` seconds with the time it was
written (``alive_at``).

At start the previous process's file is read. Its ended holdings are kept as
they are; one still open then was held until that process died — its engines
die with it (``guard``: PDEATHSIG) — which was after its last ``alive_at``
and before the next heartbeat, so it ends at ``alive_at``: at most
``HEARTBEAT`` short, instead of lost, or cut at the cost meter's last pass a
minute earlier. A clean stop ends every holding itself.

The file holds no secret and is small (one entry per replica started in the
last ``HOLDINGS_KEPT``); a file that cannot be read is logged and ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

import msgspec

from llmgw.scheduler.base import Holding

log = logging.getLogger("llmgw.scheduler.local")

HEARTBEAT = 5.0
FILE = "holdings.json"


class _Journal(msgspec.Struct, kw_only=True):
    alive_at: float
    holdings: list[Holding] = []


_decode = msgspec.json.Decoder(_Journal).decode
_encode = msgspec.json.Encoder().encode


class HoldingsJournal:
    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / FILE

    def load(self) -> list[Holding]:
        """The previous process's holdings, each open one ended at its last heartbeat."""
        try:
            journal = _decode(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("the holdings of the last run in %s cannot be read (%s); the cost of "  # noqa: TRY400
                      "what it held after the cost meter's last pass is not counted",
                      self.path, exc)
            return []
        return [h if h.end is not None else msgspec.structs.replace(h, end=journal.alive_at)
                for h in journal.holdings]

    def save(self, holdings: list[Holding], now: float) -> None:
        """Replace the file (blocking: call it off the event loop)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{FILE}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_encode(_Journal(alive_at=now, holdings=holdings)))
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
