"""The team and key forms: what each offers, and reading them with every problem found.

A team's form offers everything ``llmgw ctl team create`` can set (the
allow-list, request and token limits, priority, request logs and cost
budgets); a key's, what ``llmgw ctl key create`` can (its own allow-list and
limits, which narrow its team's). Each field is read on its own and checked
by the rule the API applies (``tenancy.check_limits``, ``check_models_known``)
applied to that field alone, so one refused form lists every problem, each
beside its field, in the words the CLI prints. Pure apart from reading the
catalog's names.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from llmgw.control.context import AppContext
from llmgw.control.tenants import served_names
from llmgw.errors import DefinitionError, RefusedError
from llmgw.tenancy import Limits, check_limits, check_models_known


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    kind: str            # "models", "int", "cost" or "choice"
    hint: str = ""
    choices: tuple[str, ...] = ()


MODELS = Field("models", "models allowed", "models",
               "comma-separated names from the catalog; empty allows every model")
RPM = Field("rpm", "requests per minute", "int")
TPM = Field("tokens_per_minute", "tokens per minute", "int")
TPD = Field("tokens_per_day", "tokens per UTC day", "int")
TPMO = Field("tokens_per_month", "tokens per UTC month", "int")
PRIORITY = Field("priority", "priority", "choice",
                 "batch waits behind interactive when replicas are saturated",
                 ("", "interactive", "batch"))
LOGS = Field("log_requests", "request logs", "choice",
             "metadata keeps each request's record; bodies also its prompt and answer",
             ("", "off", "metadata", "bodies"))
LOG_DAYS = Field("log_retention_days", "keep logs (days)", "int", "default 30")
COST_DAY = Field("cost_per_day", "cost budget per UTC day", "cost",
                 "in the currency of the configured prices")
COST_MONTH = Field("cost_per_month", "cost budget per UTC month", "cost")

TEAM_FIELDS: tuple[Field, ...] = (MODELS, RPM, TPM, TPD, TPMO, PRIORITY, LOGS, LOG_DAYS,
                                  COST_DAY, COST_MONTH)
KEY_FIELDS: tuple[Field, ...] = (MODELS, RPM, TPM, TPD, TPMO, PRIORITY)


def _value(f: Field, raw: str) -> object:
    if f.kind == "models":
        names = [m.strip() for m in raw.split(",") if m.strip()]
        return names or None
    if not raw:
        return None
    if f.kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise DefinitionError(f"{f.name}: {raw!r} is not a whole number",
                                  field=f.name) from None
    if f.kind == "cost":
        try:
            return float(raw)
        except ValueError:
            raise DefinitionError(f"{f.name}: {raw!r} is not a number", field=f.name) from None
    if raw not in f.choices:
        raise DefinitionError(f"{f.name}: {raw!r} is not one of "
                              f"{', '.join(c for c in f.choices if c)}", field=f.name)
    return raw


def limits_from(ctx: AppContext, data: dict[str, str], fields: tuple[Field, ...],
                ) -> tuple[Limits | None, list[tuple[str, str]]]:
    """The limits the form asks for, or None and every problem (field, message)."""
    values: dict[str, object] = {}
    errors: list[tuple[str, str]] = []
    known = served_names(ctx)
    for f in fields:
        try:
            value = _value(f, data.get(f.name, "").strip())
            if value is None:
                continue
            # Unchecked construction, so the house rule words the refusal, not msgspec.
            one = msgspec.structs.replace(Limits(), **{f.name: value})
            check_limits(one, "this form")
            check_models_known(one, known, "this form")
        except (DefinitionError, RefusedError) as exc:
            errors.append((f.name, exc.message.replace("this form: ", "")))
            continue
        values[f.name] = value
    if errors:
        return None, errors
    return msgspec.convert(values, Limits), []
