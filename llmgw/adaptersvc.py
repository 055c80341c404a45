"""Runtime adapters in the store, beside the runtime models they are served on.

An adapter added at run time is kept in the store's catalog table, the
``models`` table, under the row name ``adapter:<name>``. Its own table would
have needed a migration in both dialects and a second set of catalog-change
statements, and gained nothing: an adapter change must take the same catalog
lock and bump the same catalog version as a model change — a base's removal
is refused while an adapter names it, which is only sound if both are read
in one transaction — and every process must reload on it. A catalog name
cannot contain ':' (``llmgw.catalog.names.NAME_RE``), so no model row can be
mistaken for an adapter row, and an older llmgw reading the table skips such
a row with a warning rather than serving it.

The rules mirror the models' (``llmgw.modelsvc``): configuration wins every
conflict — a stored adapter named like a declared one is skipped, and a
declared one cannot be removed or replaced here — and a stored adapter that
no longer makes a valid catalog (its base was removed from the YAML) is
skipped and named, never taking the cluster with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.catalog.adapter import Adapter, check_adapters
from llmgw.catalog.build import Provenance, Runtime
from llmgw.catalog.decode import decode_json
from llmgw.catalog.model import Model
from llmgw.errors import DefinitionError
from llmgw.store.base import StoredModel

ROW_PREFIX = "adapter:"


def row_name(adapter: str) -> str:
    return f"{ROW_PREFIX}{adapter}"


def is_adapter_row(row: StoredModel) -> bool:
    return row.name.startswith(ROW_PREFIX)


def model_rows(rows: Sequence[StoredModel]) -> list[StoredModel]:
    return [r for r in rows if not is_adapter_row(r)]


def adapter_rows(rows: Sequence[StoredModel]) -> dict[str, StoredModel]:
    """The stored adapters' rows, by adapter name."""
    return {r.name[len(ROW_PREFIX):]: r for r in rows if is_adapter_row(r)}


def decode_row(name: str, row: StoredModel) -> Adapter:
    adapter = decode_json(row.definition, Adapter, source=f"stored adapter {name!r}")
    if adapter.name != name:
        raise DefinitionError(f"stored adapter {name!r}: its definition is named "
                              f"{adapter.name!r}")
    return adapter


def assemble(declared: Sequence[Adapter], rows: Mapping[str, StoredModel],
             models: Mapping[str, Model], runtime: Runtime, config_name: str,
             skipped: dict[str, str]) -> tuple[list[Adapter], dict[str, StoredModel]]:
    """Declared adapters plus every stored one that is valid with ``models``; the stored
    ones skipped go to ``skipped`` with the reason (keyed ``adapter <name>``)."""
    declared_names = {a.name for a in declared}
    out = list(declared)
    kept: dict[str, StoredModel] = {}
    for name in sorted(rows):
        row = rows[name]
        key = f"adapter {name}"
        if name in declared_names:
            skipped[key] = (f"an adapter of that name is declared in {config_name}, and "
                            "configuration wins; remove the stored one")
            continue
        try:
            adapter = decode_row(name, row)
            check_adapters([adapter], models, scheduler=runtime.scheduler,
                           mirror=runtime.mirror)
        except DefinitionError as exc:
            skipped[key] = f"it does not make a valid catalog: {exc.message}"
            continue
        out.append(adapter)
        kept[name] = row
    return out, kept


def provenance(rows: Mapping[str, StoredModel]) -> dict[str, Provenance]:
    return {name: Provenance(origin="runtime", added_by=row.added_by)
            for name, row in rows.items()}


def dependants(adapters: Sequence[Adapter], base: str) -> list[str]:
    """The adapters served on ``base``."""
    return sorted(a.name for a in adapters if a.base == base)
