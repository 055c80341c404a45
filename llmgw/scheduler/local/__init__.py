"""The embedded scheduler: llmgw running the catalog on this machine.

``backend.LocalBackend`` is the entry point. The other modules are its parts:
``resources`` (placement arithmetic), ``planner`` (which replicas to start and
stop), ``engines`` (command lines), ``gguf`` (model file headers) — all pure —
and ``machine``, ``supervisor`` and ``guard``, which touch the operating system.

Nothing is imported here: ``guard`` runs as the first code of every engine
process and must start without loading the rest.
"""
