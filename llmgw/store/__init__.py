"""Persistence: runtime models, the catalog version and leases (see ``base``)."""

from llmgw.store.base import CatalogChange, Store, StoredModel

__all__ = ["CatalogChange", "Store", "StoredModel", "open_store"]


def open_store(url: str) -> Store:
    """The adapter for ``url`` (``sqlite:///path`` or ``postgresql://…``), not yet opened."""
    if url.startswith("sqlite://"):
        from llmgw.store.sqlite import SqliteStore

        return SqliteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from llmgw.store.postgres import PostgresStore

        return PostgresStore(url)
    from llmgw.errors import ConfigError

    raise ConfigError(f"database: {url!r} is neither sqlite:///PATH nor postgresql://…")
