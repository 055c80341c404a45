"""llmgw: a control plane and OpenAI-compatible gateway for a catalog of LLMs.

The catalog (``llmgw.catalog``) is the one description of what should run. A
scheduler backend (``llmgw.scheduler``: Nomad in production, child processes on
one machine by default) makes it run, and the gateway (``llmgw.gateway``) routes
inference to the replicas that are healthy. Everything that decides something
is a plain function over typed values; everything that talks to the outside
world sits behind a small Protocol with real adapters.
"""

__version__ = "0.1.0"
