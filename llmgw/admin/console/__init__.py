"""The operator's console pages: spend, request logs, live models, replicas, the
playground, the guided add form and the mirror.

Each page is a module of its own over ``llmgw.control`` (the same views the JSON
API answers with), on the shared layout of ``llmgw.admin.render``; changes go
through post/redirect/get (``llmgw.admin.actions.done``). ``route_handlers``
collects them for the admin router; ``templates/_console_nav.html`` is their
block of the navigation.

* ``spend``    — cost per team, key and model, budget gauges, key limits,
  expiry and rotation;
* ``reqlogs``  — a logging team's requests, filtered, and one request opened;
* ``live``     — per-model figures from the gateway's own metrics, refreshed
  by ``static/console.js`` from a JSON endpoint;
* ``replicas`` — every replica with its phase, node, restarts and engine log;
* ``playground`` — a chat against any model, streamed by the browser itself;
* ``guided``   — adding a model from a form, with the YAML it will store;
* ``mirror``   — what the weights mirror holds and which models use it.
"""

from __future__ import annotations

from llmgw.admin.console import guided, live, mirror, playground, replicas, reqlogs, spend

route_handlers = [*spend.route_handlers, *live.route_handlers, *replicas.route_handlers,
                  *reqlogs.route_handlers, *playground.route_handlers,
                  *guided.route_handlers, *mirror.route_handlers]
