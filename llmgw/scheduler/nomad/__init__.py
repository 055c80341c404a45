"""The Nomad backend: catalog entries become Nomad service jobs, and Nomad's
allocations, services and nodes come back as replicas, endpoints and a fleet.

Pure modules decide; the others talk to Nomad:

* ``jobspec`` — the job payload as typed structs with Nomad's field names;
* ``render`` — a model and profile → the job (pure);
* ``placement`` — a failed plan → one readable sentence, never-fits or not-now (pure);
* ``fleet`` — nodes and allocations → free capacity as the scheduler counts it (pure);
* ``reconcile`` — the catalog and the jobs llmgw owns → what to change (pure);
* ``wire`` — what Nomad answers, decoded leniently;
* ``client`` — python-nomad underneath, llmgw's errors on top;
* ``discovery`` — healthy endpoints from services and allocation checks;
* ``replicas`` — allocations as replicas with reserved and measured memory;
* ``backend`` — ``NomadBackend``, the ``Backend`` the rest of llmgw sees.

The package is named after the system it drives; python-nomad's import name
is ``nomad``, which is why the agent configuration lives in ``nomad/`` at the
top of the repository with no Python in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.scheduler.nomad.backend import NomadBackend

__all__ = ["NomadBackend"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing a pure module (``render`` for `llmgw jobspec
    # render`) does not load python-nomad, requests and the store.
    if name == "NomadBackend":
        from llmgw.scheduler.nomad.backend import NomadBackend

        return NomadBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
