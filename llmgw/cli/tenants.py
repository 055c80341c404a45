"""``llmgw ctl team …``, ``llmgw ctl key …``: teams and keys created at run time;
``llmgw ctl usage``: what they used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import click

from llmgw.cli.client import ApiClient, pass_client
from llmgw.cli.output import failures, output_option, print_json, print_table

F = Callable[..., Any]


def limit_options(fn: F) -> F:
    """The limits a team sets and a key narrows (absent: no limit, or the team's)."""
    for decorator in reversed((
        click.option("--models", default=None, metavar="M1,M2",
                     help="Comma-separated allow-list (absent: every model, or the team's)."),
        click.option("--rpm", type=int, default=None,
                     help="Requests per minute, per gateway process."),
        click.option("--tokens-per-minute", type=int, default=None,
                     help="Tokens (prompt + completion) per minute, across instances."),
        click.option("--tokens-per-day", type=int, default=None,
                     help="Tokens per UTC day, across instances."),
        click.option("--tokens-per-month", type=int, default=None,
                     help="Tokens per UTC calendar month, across instances."),
        click.option("--priority", type=click.Choice(["interactive", "batch"]), default=None,
                     help="Admission class when a model is saturated."),
        click.option("--when-store-down", type=click.Choice(["refuse", "admit"]),
                     default=None, help="What the token budgets do once a gateway's slice "
                     "of them lapses with the store unreachable (default: refuse)."),
    )):
        fn = decorator(fn)
    return fn


def _limits(models: str | None, rpm: int | None, tokens_per_minute: int | None,
            tokens_per_day: int | None, tokens_per_month: int | None,
            priority: str | None, when_store_down: str | None) -> dict[str, Any]:
    numbers = {"rpm": rpm, "tokens_per_minute": tokens_per_minute,
               "tokens_per_day": tokens_per_day, "tokens_per_month": tokens_per_month,
               "priority": priority, "when_store_down": when_store_down}
    out: dict[str, Any] = {k: v for k, v in numbers.items() if v is not None}
    if models is not None:
        out["models"] = [m.strip() for m in models.split(",") if m.strip()]
    return out


def _limits_text(limits: dict[str, Any]) -> str:
    parts = ["models " + ",".join(limits["models"])] if "models" in limits else []
    parts.extend(f"{name.replace('_', ' ')} {limits[name]}" for name in (
        "rpm", "tokens_per_minute", "tokens_per_day", "tokens_per_month", "priority",
        "when_store_down", "log_requests", "log_retention_days", "cost_per_day", "cost_per_month")
        if name in limits)
    return "; ".join(parts) or "no limits"


@click.group()
def team() -> None:
    """Create, list, limit and revoke teams (their keys: `llmgw ctl key`)."""


def log_options(fn: F) -> F:
    """The settings only a team has: request logs and cost budgets."""
    fn = click.option("--cost-per-month", type=float, default=None,
                      help="Budget of attributed GPU/CPU cost per UTC month.")(fn)
    fn = click.option("--cost-per-day", type=float, default=None,
                      help="Budget of attributed GPU/CPU cost per UTC day.")(fn)
    fn = click.option("--log-retention-days", type=int, default=None,
                      help="How long request logs are kept (default 30).")(fn)
    return click.option("--log-requests", type=click.Choice(["off", "metadata", "bodies"]),
                        default=None, help="Keep each request's record (metadata), and "
                        "also its prompt and answer (bodies).")(fn)


def _with_logs(limits: dict[str, Any], log_requests: str | None,
               log_retention_days: int | None, cost_per_day: float | None,
               cost_per_month: float | None) -> dict[str, Any]:
    given = {"log_requests": log_requests, "log_retention_days": log_retention_days,
             "cost_per_day": cost_per_day, "cost_per_month": cost_per_month}
    limits.update({k: v for k, v in given.items() if v is not None})
    return limits


@team.command("add")
@click.argument("name")
@limit_options
@log_options
@output_option
@pass_client
def team_add(client: ApiClient, name: str, models: str | None,
             rpm: int | None, tokens_per_minute: int | None, tokens_per_day: int | None,
             tokens_per_month: int | None, priority: str | None,
             when_store_down: str | None, log_requests: str | None,
             log_retention_days: int | None, cost_per_day: float | None,
             cost_per_month: float | None, output: str) -> None:
    """Create a team with its limits."""
    with failures():
        limits = _with_logs(_limits(models, rpm, tokens_per_minute, tokens_per_day,
                                    tokens_per_month, priority, when_store_down), log_requests,
                            log_retention_days, cost_per_day, cost_per_month)
        t = client.post("/api/v1/teams", json={"name": name, "limits": limits})
    if output == "json":
        print_json(t)
    else:
        click.echo(f"created team {t['name']}: {_limits_text(t['limits'])}")


@team.command("set")
@click.argument("name")
@limit_options
@log_options
@output_option
@pass_client
def team_set(client: ApiClient, name: str, models: str | None,
             rpm: int | None, tokens_per_minute: int | None, tokens_per_day: int | None,
             tokens_per_month: int | None, priority: str | None,
             when_store_down: str | None, log_requests: str | None,
             log_retention_days: int | None, cost_per_day: float | None,
             cost_per_month: float | None, output: str) -> None:
    """Replace a team's limits (those not given are lifted)."""
    with failures():
        limits = _with_logs(_limits(models, rpm, tokens_per_minute, tokens_per_day,
                                    tokens_per_month, priority, when_store_down), log_requests,
                            log_retention_days, cost_per_day, cost_per_month)
        t = client.put(f"/api/v1/teams/{quote(name)}/limits", json=limits)
    if output == "json":
        print_json(t)
    else:
        click.echo(f"team {t['name']}: {_limits_text(t['limits'])}")


@team.command("list")
@output_option
@pass_client
def team_list(client: ApiClient, output: str) -> None:
    """List the teams, their limits and keys."""
    with failures():
        teams = client.get("/api/v1/teams")
    if output == "json":
        print_json(teams)
        return
    print_table([(t["name"], _limits_text(t["limits"]), ",".join(t["keys"]) or "-",
                  t["created_by"]) for t in teams], ["team", "limits", "keys", "created by"])


@team.command("revoke")
@click.argument("name")
@pass_client
def team_revoke(client: ApiClient, name: str) -> None:
    """Revoke a team and every key of it (refused by every gateway within a second)."""
    with failures():
        client.delete(f"/api/v1/teams/{quote(name)}")
    click.echo(f"revoked team {name} and its keys")


@click.group()
def key() -> None:
    """Create, list and revoke runtime keys (the keys file: `llmgw keys`)."""


@key.command("add")
@click.argument("name")
@click.option("--team", "team_name", required=True, help="The team the key belongs to.")
@limit_options
@pass_client
def key_add(client: ApiClient, name: str, team_name: str, models: str | None,
            rpm: int | None, tokens_per_minute: int | None, tokens_per_day: int | None,
            tokens_per_month: int | None, priority: str | None,
            when_store_down: str | None) -> None:
    """Create a key and print it: it is shown this once and stored only as a hash."""
    with failures():
        limits = _limits(models, rpm, tokens_per_minute, tokens_per_day, tokens_per_month,
                         priority, when_store_down)
        k = client.post("/api/v1/keys", json={"name": name, "team": team_name, "limits": limits})
    click.echo(k["key"])


@key.command("list")
@click.option("--team", "team_name", default=None, help="Only this team's keys.")
@output_option
@pass_client
def key_list(client: ApiClient, team_name: str | None, output: str) -> None:
    """List runtime keys: names, teams and limits, never the keys."""
    with failures():
        keys = client.get("/api/v1/keys" + (f"?team={quote(team_name)}" if team_name else ""))
    if output == "json":
        print_json(keys)
        return
    print_table([(k["name"], k["team"], _limits_text(k["limits"]), k["created_by"])
                 for k in keys], ["key", "team", "limits", "created by"])


@key.command("revoke")
@click.argument("name")
@pass_client
def key_revoke(client: ApiClient, name: str) -> None:
    """Revoke a runtime key."""
    with failures():
        client.delete(f"/api/v1/keys/{quote(name)}")
    click.echo(f"revoked key {name}")


@click.command("usage")
@click.option("--by", type=click.Choice(["team", "key", "model"]), default="team",
              show_default=True, help="Group requests and tokens by this.")
@click.option("--since", default=None, metavar="TIME",
              help="ISO 8601 start (default: a day ago by hour, 30 days by day).")
@click.option("--until", default=None, metavar="TIME", help="ISO 8601 end (default: now).")
@click.option("--granularity", type=click.Choice(["hour", "day"]), default="hour",
              show_default=True, help="Bucket size (days are UTC days).")
@click.option("--totals", "totals_only", is_flag=True,
              help="One line per group over the whole span, not one per bucket.")
@output_option
@pass_client
def usage(client: ApiClient, by: str, since: str | None, until: str | None,
          granularity: str, totals_only: bool, output: str) -> None:
    """Requests and tokens from the usage ledger, per hour or day."""
    query = {"by": by, "granularity": granularity}
    if since:
        query["since"] = since
    if until:
        query["until"] = until
    with failures():
        report = client.get("/api/v1/usage?" + urlencode(query))
    if output == "json":
        print_json(report)
        return
    click.echo(f"usage by {report['by']} from {report['since']} to {report['until']}")
    columns = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens",
               "total_tokens"]
    headers = [c.replace("_tokens", "") for c in columns]
    if totals_only:
        print_table([(t["group"], *(t[c] for c in columns)) for t in report["totals"]],
                    [by, *headers])
        return
    print_table([(b["start"], b["group"], *(b[c] for c in columns))
                 for b in report["buckets"]], [granularity, by, *headers])


@click.command("costs")
@click.option("--since", default=None, metavar="TIME",
              help="ISO 8601 start (default: 30 days ago).")
@click.option("--until", default=None, metavar="TIME", help="ISO 8601 end (default: now).")
@output_option
@pass_client
def costs(client: ApiClient, since: str | None, until: str | None, output: str) -> None:
    """Cost of GPU and CPU time per team and per model, attributed by tokens."""
    query = {k: v for k, v in (("since", since), ("until", until)) if v}
    with failures():
        report = client.get("/api/v1/costs" + (f"?{urlencode(query)}" if query else ""))
    if output == "json":
        print_json(report)
        return
    click.echo(f"cost from {report['since']} to {report['until']}: {report['total']:.2f} "
               f"(idle time: account {report['overhead_account']})")
    print_table([(t["team"], f"{t['cost']:.2f}", t["tokens"]) for t in report["teams"]],
                ["team", "cost", "tokens"])
    click.echo("")
    print_table([(m["model"], f"{m['cost']:.2f}", f"{m['gpu_hours']:.2f}",
                  f"{m['core_hours']:.2f}", m["tokens"],
                  "-" if m["cost_per_million_tokens"] is None
                  else f"{m['cost_per_million_tokens']:.2f}", f"{m['idle_cost']:.2f}")
                 for m in report["models"]],
                ["model", "cost", "gpu hours", "core hours", "tokens", "per 1M tokens", "idle"])
    if report["unpriced"]:
        click.echo(f"warning: no price_per_hour for GPU class(es) {', '.join(report['unpriced'])}"
                   "; their time is not counted", err=True)


@team.command("logs")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="How many, newest first.")
@pass_client
def team_logs(client: ApiClient, name: str, limit: int) -> None:
    """Print a team's request logs as JSON (teams that set --log-requests)."""
    with failures():
        logs = client.get(f"/api/v1/teams/{quote(name)}/logs?limit={limit}")
    print_json(logs)
