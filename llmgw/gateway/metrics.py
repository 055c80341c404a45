"""Prometheus metrics of the gateway, served at ``/metrics``.

Each Gateway owns its registry (so two gateways in one process, as in tests,
do not collide); ``/metrics`` renders it followed by the process-wide default
registry, where the process collectors and anything the control plane
registers live.

Label values are bounded: ``model`` is a catalog model name, ``(unknown)``
for a name the catalog does not have (so a client inventing names cannot grow
the series without bound), or empty for a request refused before its body was
read (no key, body too large, malformed JSON). Replica URLs are deliberately
not a label: on Nomad every restart is a new port, so they would grow forever.

The hot path must not pay for label lookups on every request, so the children
of each model are resolved once and cached (``for_model``).

**Several worker processes** (``llmgw serve --workers N``) share one port, so
a scrape reaches one of them at random. Counters, histograms and the in-flight
and queued gauges are then kept in prometheus_client's multiprocess mode (one
memory-mapped file per process under ``PROMETHEUS_MULTIPROC_DIR``, summed at
scrape time), chosen over a ``worker`` label because a label would only let a
scrape see the one worker that answered it. The figures every process knows
alike (healthy replicas, engine queues, the scaler's decision) come from the
answering process's collectors.

Every metric is listed with its labels in the README table; keep them in step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST.encode()
UNKNOWN_MODEL = "(unknown)"

# Latency of whole requests spans four orders of magnitude: a cached embedding
# answers in milliseconds, a long generation in minutes.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                    600)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)

# (model, healthy replicas, ejected replicas) for every model, read at scrape time.
ReplicaCounts = Callable[[], Iterable[tuple[str, int, int]]]
# (family, label values, value) of the figures below, read at scrape time.
LiveFigures = Callable[[], Iterable[tuple[str, tuple[str, ...], float]]]
_LIVE = {
    "llmgw_gateway_engine_requests": (
        "Requests the replicas' engines report, summed over the replicas of a model with a "
        "fresh scrape, by state (running, waiting).", ["model", "state"]),
    "llmgw_gateway_engine_kv_cache_usage": (
        "KV-cache usage (0..1) the engines report, the mean over the replicas of a model with "
        "a fresh scrape.", ["model"]),
    "llmgw_gateway_desired_replicas": (
        "The scaler's desired replica count for a model, with the kind of its last decision "
        "(load, min, max, stabilising, loading, capacity).", ["model", "reason"]),
    "llmgw_gateway_budget_used_ratio": (
        "Share of a team's budget used in its current period: tokens as the budget check "
        "counts them over tokens_per_minute, tokens_per_day or tokens_per_month, or the cost "
        "meter's figure over cost_per_day or cost_per_month.", ["team", "budget"]),
    "llmgw_gateway_budget_slice_tokens": (
        "This process's slice of a token budget (key empty: the team's), by state: "
        "available (granted, not yet reserved or spent; 0 while the lease has lapsed), "
        "reserved (by requests in flight), unwritten (spent, not yet in the store's "
        "totals).", ["team", "key", "budget", "state"]),
    "llmgw_gateway_budget_slice_lease_seconds": (
        "Seconds this process may still use its slice of a token budget without renewing "
        "it; 0: lapsed, the budget's when_store_down applies.", ["team", "key", "budget"]),
    # The scheduler's own view, as this process reads it (the relay's copy in a worker).
    "llmgw_scheduler_desired_replicas": (
        "Replicas the scheduler is asked to run for a scheduled model (scaling.min, or the "
        "scaler's or an on-demand count).", ["model"]),
    "llmgw_scheduler_crash_loop": (
        "1 while the scheduler reports a scheduled model's replicas of its current version "
        "failing over and over with none running, else 0.", ["model"]),
    "llmgw_scheduler_up": (
        "1 while the scheduler answers (Nomad is reachable, or the local scheduler runs), "
        "else 0.", []),
}


class _LiveCollector(Collector):
    def __init__(self, figures: LiveFigures) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        families = {name: GaugeMetricFamily(name, text, labels=labels)
                    for name, (text, labels) in _LIVE.items()}
        for name, labels, value in self._figures():
            families[name].add_metric(list(labels), value)
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _ReplicaCollector(Collector):
    def __init__(self, counts: ReplicaCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "llmgw_gateway_healthy_replicas",
            "Replicas the gateway may route to: healthy by the scheduler's checks, or a "
            "model's upstream URLs.", labels=["model"])
        ejected = GaugeMetricFamily(
            "llmgw_gateway_ejected_replicas",
            "Healthy replicas the gateway is keeping out of rotation after failed requests.",
            labels=["model"])
        for model, n_healthy, n_ejected in self._counts():
            healthy.add_metric([model], n_healthy)
            ejected.add_metric([model], n_ejected)
        yield healthy
        yield ejected

    def describe(self) -> Iterator[Metric]:
        return iter(())


class ModelMetrics:
    """The label children of one model, resolved once."""

    __slots__ = (
        "_m",
        "_name",
        "_status",
        "in_flight",
        "latency",
        "queue_wait",
        "tokens_cached",
        "tokens_completion",
        "tokens_prompt",
        "ttft",
    )

    def __init__(self, m: GatewayMetrics, name: str) -> None:
        self._m = m
        self._name = name
        self._status: dict[int, Counter] = {}
        self.in_flight = m.in_flight.labels(name)
        self.latency = m.latency.labels(name)
        self.ttft = m.ttft.labels(name)
        self.tokens_prompt = m.tokens.labels(name, "prompt")
        self.tokens_completion = m.tokens.labels(name, "completion")
        self.tokens_cached = m.tokens.labels(name, "cached")
        self.queue_wait = m.queue_wait.labels(name)

    def done(self, status: int) -> None:
        child = self._status.get(status)
        if child is None:
            child = self._status[status] = self._m.requests.labels(self._name, str(status))
        child.inc()


class GatewayMetrics:
    def __init__(self, replica_counts: ReplicaCounts, live: LiveFigures = lambda: ()) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "llmgw_gateway_requests", "Inference requests answered, by requested model and "
            "HTTP status.", ["model", "status"], registry=r)
        self.latency = Histogram(
            "llmgw_gateway_request_duration_seconds", "Time from the request's arrival to the "
            "last byte of its response, by requested model.", ["model"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(
            "llmgw_gateway_time_to_first_token_seconds", "Streaming requests: time from arrival "
            "to the first chunk sent to the client, by requested model.", ["model"],
            buckets=_TTFT_BUCKETS, registry=r)
        self.in_flight = Gauge(
            "llmgw_gateway_in_flight_requests", "Inference requests being served now, by "
            "requested model.", ["model"], registry=r, multiprocess_mode="livesum")
        self.queued = Gauge(
            "llmgw_gateway_queued_requests", "Requests waiting in a model's admission queue "
            "because every replica is saturated, by priority class.", ["model", "priority"],
            registry=r, multiprocess_mode="livesum")
        self.queue_wait = Histogram(
            "llmgw_gateway_queue_wait_seconds", "How long admitted requests waited in the "
            "admission queue, by requested model.", ["model"], buckets=_TTFT_BUCKETS,
            registry=r)
        self.rejected = Counter(
            "llmgw_gateway_admission_rejections", "Requests answered 429 by admission "
            "control, by requested model and reason (queue_full, queue_timeout).",
            ["model", "reason"], registry=r)
        self.retries = Counter(
            "llmgw_gateway_retries", "Attempts on another replica of the same model after a "
            "failure before the first byte.", ["model"], registry=r)
        self.fallbacks = Counter(
            "llmgw_gateway_fallbacks", "Requests passed to a fallback model, by requested "
            "model and the fallback tried.", ["model", "fallback"], registry=r)
        self.upstream_errors = Counter(
            "llmgw_gateway_upstream_errors", "Failed attempts at a replica, by the model "
            "tried and the reason (connect, timeout, status_5xx, broken, stream_broken, "
            "idle_timeout, resume_refused).", ["model", "reason"], registry=r)
        self.resumed = Counter(
            "llmgw_gateway_streams_resumed", "Broken streams continued by another replica of "
            "the same model (or ended cleanly when only their end was lost), by model.",
            ["model"], registry=r)
        self.adapter_loads = Counter(
            "llmgw_gateway_adapter_loads", "LoRA adapter loads this gateway asked replicas "
            "for, by base model, adapter and outcome (loaded, refused).",
            ["model", "adapter", "outcome"], registry=r)
        self.unrecoverable = Counter(
            "llmgw_gateway_streams_unrecoverable", "Broken streams ended with an error event, "
            "by model and why they were not resumed (not_resumable: the request, engine or "
            "model does not allow it; limit: routing.resume_streams reached; no_replica: no "
            "other replica could continue).", ["model", "reason"], registry=r)
        self.tokens = Counter(
            "llmgw_gateway_tokens", "Tokens reported in the engines' usage fields (also in "
            "streams when the engine sends usage), by answering model and kind (prompt, "
            "completion, cached: prompt tokens served from the prefix cache).",
            ["model", "kind"], registry=r)
        self.scale_changes = Counter(
            "llmgw_gateway_scaler_changes", "Replica counts the scaler asked the scheduler "
            "for (this process held the scaler lease), by direction (up, down).",
            ["model", "direction"], registry=r)
        self.scale_ups = Counter(
            "llmgw_gateway_scale_ups", "On-demand models this process asked the scheduler to "
            "start (holding the scale-up lease).", ["model"], registry=r)
        self.scale_downs = Counter(
            "llmgw_gateway_scale_downs", "On-demand models this process scaled back to zero "
            "after their idle timeout.", ["model"], registry=r)
        self.cold_wait = Histogram(
            "llmgw_gateway_cold_start_wait_seconds", "How long requests were held waiting for "
            "an on-demand model's first replica.", ["model"], buckets=_TTFT_BUCKETS,
            registry=r)
        self.batch_lines = Counter(
            "llmgw_gateway_batch_lines", "Batch lines sent to a model and answered, by model "
            "and outcome (succeeded: 2xx; failed: any other status after retries).",
            ["model", "outcome"], registry=r)
        self.team_tokens = Counter(
            "llmgw_gateway_team_tokens", "Tokens the engines reported for each team's "
            "requests, by team (- for keys of the keys file), answering model and kind "
            "(prompt, completion).", ["team", "model", "kind"], registry=r)
        self.ledger_dropped = Counter(
            "llmgw_gateway_ledger_dropped_records", "Usage records dropped because the "
            "ledger's buffer was full while the store could not be written.", registry=r)
        self.slice_renewals = Counter(
            "llmgw_gateway_budget_slice_renewals", "Renewals of this process's slices of "
            "token budgets, by outcome (granted: more tokens; kept: no more wanted; "
            "exhausted: the budget had no more room; failed: the store did not answer).",
            ["outcome"], registry=r)
        self.budget_unchecked = Counter(
            "llmgw_gateway_budget_unchecked_requests", "Requests of a budget whose slice "
            "lapsed because the store could not be reached, by team, budget and outcome "
            "(refused: when_store_down refuse, answered 503; admitted: when_store_down "
            "admit).", ["team", "budget", "outcome"], registry=r)
        self.ledger_unjournaled = Counter(
            "llmgw_gateway_ledger_unjournaled_records", "Usage records that could not be "
            "journaled (gateway.journal_max reached, or the write failed): kept in memory "
            "while it had room, else dropped.", registry=r)
        self.ledger_journal_bytes = Gauge(
            "llmgw_gateway_ledger_journal_bytes", "Bytes of usage records in the journal's "
            "files (up to 1 MiB of them already in the store).", registry=r,
            multiprocess_mode="livesum")
        self.ledger_waiting = Gauge(
            "llmgw_gateway_ledger_waiting_records", "Usage records not yet in the store, in "
            "memory or in the journal only.", registry=r, multiprocess_mode="livesum")
        self.key_reloads = Counter(
            "llmgw_gateway_key_reloads", "Times the keys file was reloaded after a change.",
            registry=r)
        # The collectors also in a registry of their own: in multiprocess mode
        # the rest is read from every process's files instead.
        self._collected = CollectorRegistry()
        for collector in (_ReplicaCollector(replica_counts), _LiveCollector(live)):
            r.register(collector)
            self._collected.register(collector)
        self._models: dict[str, ModelMetrics] = {}
        self._team_tokens: dict[tuple[str, str], tuple[Counter, Counter]] = {}

    def add_team_tokens(self, team: str, model: str, prompt: int, completion: int) -> None:
        children = self._team_tokens.get((team, model))
        if children is None:
            children = self._team_tokens[(team, model)] = (
                self.team_tokens.labels(team, model, "prompt"),
                self.team_tokens.labels(team, model, "completion"))
        children[0].inc(prompt)
        children[1].inc(completion)

    def for_model(self, name: str) -> ModelMetrics:
        mm = self._models.get(name)
        if mm is None:
            mm = self._models[name] = ModelMetrics(self, name)
        return mm

    def counted_samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The request counters, histograms and gauges the admin console's live view
        reads, as (name, labels, value): safe to read from any thread (each metric
        takes its own lock), so a fleet's thousands of series can be read off the
        event loop. With several worker processes, every process's, from their files."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            every = CollectorRegistry()
            MultiProcessCollector(every)  # type: ignore[no-untyped-call]
            families: Iterable[Metric] = every.collect()
        else:
            families = (f for m in (self.requests, self.latency, self.ttft, self.tokens,
                                    self.rejected, self.queued, self.in_flight)
                        for f in m.collect())
        for family in families:
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value

    def state_samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The figures read from the gateway's state at scrape time (healthy and ejected
        replicas, engine queues, the scaler): on the gateway's event loop only."""
        for family in self._collected.collect():
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            every = CollectorRegistry()
            MultiProcessCollector(every)  # type: ignore[no-untyped-call]
            return generate_latest(every) + generate_latest(self._collected)
        return generate_latest(self.registry) + generate_latest(REGISTRY)
