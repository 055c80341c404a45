"""The OpenAI-compatible gateway: one endpoint in front of every replica.

Split by noun:

* ``app``       — the ASGI entry (``Gateway``): keys, limits, admission, dispatch, disconnects;
* ``request``   — the client's request: its bounded body and its ``model``/``stream``;
* ``routing``   — pure: replica choice by policy, load and headroom, ejection and back-off;
* ``ring``      — pure: consistent hashing with bounded load;
* ``prefix``    — pure: the prefix key of a prompt;
* ``signals``   — scraping the engines' ``/metrics`` into the balancer;
* ``admission`` — the bounded priority queue of requests for a saturated model;
* ``scaling``   — pure: the scaler's decision; ``scaler`` — its loop, lease and reports;
* ``proxy``     — the upstream client: forwarding, streaming, retries and fallbacks;
* ``ondemand``  — scale-from-zero and idle scale-down of ``min: 0`` models;
* ``keys``     — the keys file, key lookup, per-key allow-lists and rate limits;
* ``metrics``  — the Prometheus metrics served at ``/metrics``;
* ``errors``   — OpenAI's error shape.

Replicas come from one place per model: an external model's ``upstream``
URLs, or the scheduler backend's healthy endpoints (Nomad service discovery
or the embedded scheduler, behind the same ``Routing`` Protocol). The gateway
never sees a replica that is still loading or failing its health check; on
top of that it keeps its own passive health (``routing``).
"""

from llmgw.gateway.app import CatalogView, Gateway

__all__ = ["CatalogView", "Gateway"]
