"""The embedded scheduler: llmgw running the catalog on this machine.

``backend.LocalBackend`` is the entry point. The other modules are its parts:
``resources`` (placement arithmetic), ``planner`` (which replicas to start and
stop), ``engines`` (command lines) — all pure — and ``machine``,
``supervisor`` and ``guard``, which touch the operating system. A model
file's header is read by ``llmgw.weights.gguf``, which the planner shares.

Nothing is imported here: ``guard`` runs as the first code of every engine
process and must start without loading the rest.
"""
