"""The live model view's figures, from two samplings of the gateway's own metrics (no I/O).

A sampling (``Snapshot``) is what ``GatewayMetrics.samples`` yields at one
instant, folded per model. Rates are the difference between the newest
sampling and one about ``WINDOW`` seconds older, divided by the time between
them, so a figure means "over the last half minute" rather than "since the
process started". Quantiles come from the histograms' bucket counts over the
same window, read the way Prometheus's ``histogram_quantile`` reads them:
linear within the bucket the rank falls in, and the bucket's lower bound when
it falls in ``+Inf``. Without an older sampling (the first look after a
start) rates are unknown and quantiles are over the process's whole life.

Requests refused before their body was read — a missing or invalid key, a
team over its budget, a key over its rate — carry no model (the label is
empty); they are figures of their own (``BEFORE_ROUTING``), not lost.

The prefix-cache hit rate is cached prompt tokens over prompt tokens in the
window, as the engines report them in usage (``llmgw_gateway_tokens``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import msgspec

BEFORE_ROUTING = ""
# How far back a rate looks, in seconds, and how long samplings are kept.
WINDOW = 30.0
KEEP = 120.0
# Samplings closer than this are not kept apart: a rate over them would be noise.
MIN_GAP = 1.0
_HISTOGRAMS = {"llmgw_gateway_time_to_first_token_seconds": "ttft",
               "llmgw_gateway_request_duration_seconds": "latency"}


class ModelSample(msgspec.Struct, kw_only=True):
    """One model's counters at one instant."""

    by_status: dict[str, float] = msgspec.field(default_factory=dict)
    # histogram → upper bound → cumulative count
    buckets: dict[str, dict[float, float]] = msgspec.field(default_factory=dict)
    prompt: float = 0.0
    cached: float = 0.0
    completion: float = 0.0
    rejected: float = 0.0          # admission 429s (queue full, queue timeout)
    queued: float = 0.0            # a gauge: now
    in_flight: float = 0.0         # a gauge: now
    healthy: float = 0.0
    ejected: float = 0.0
    kv_cache: float | None = None


class Snapshot(msgspec.Struct, kw_only=True):
    at: float
    models: dict[str, ModelSample]


def fold(samples: Iterable[tuple[str, dict[str, str], float]], at: float) -> Snapshot:
    """The samples the gateway yields, per model."""
    models: dict[str, ModelSample] = {}

    def of(labels: dict[str, str]) -> ModelSample | None:
        # "" is a real label value: requests refused before their model was read (no
        # key, a key's budget or rate limit, a malformed body).
        name = labels.get("model")
        if name is None:
            return None
        m = models.get(name)
        if m is None:
            m = models[name] = ModelSample()
        return m

    for name, labels, value in samples:
        m = of(labels)
        if m is None:
            continue
        if name == "llmgw_gateway_requests_total":
            status = labels.get("status", "")
            m.by_status[status] = m.by_status.get(status, 0.0) + value
        elif name.endswith("_bucket") and name[:-7] in _HISTOGRAMS:
            le = float(labels["le"])
            h = m.buckets.setdefault(_HISTOGRAMS[name[:-7]], {})
            h[le] = h.get(le, 0.0) + value
        elif name == "llmgw_gateway_tokens_total":
            kind = labels.get("kind")
            if kind == "prompt":
                m.prompt += value
            elif kind == "cached":
                m.cached += value
            elif kind == "completion":
                m.completion += value
        elif name == "llmgw_gateway_admission_rejections_total":
            m.rejected += value
        elif name == "llmgw_gateway_queued_requests":
            m.queued += value
        elif name == "llmgw_gateway_in_flight_requests":
            m.in_flight += value
        elif name == "llmgw_gateway_healthy_replicas":
            m.healthy = value
        elif name == "llmgw_gateway_ejected_replicas":
            m.ejected = value
        elif name == "llmgw_gateway_engine_kv_cache_usage":
            m.kv_cache = value
    return Snapshot(at=at, models=models)


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The q-quantile of a cumulative histogram (upper bound → count), or None if empty."""
    bounds = sorted(buckets)
    if not bounds:
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, count
    return lower


class ModelLive(msgspec.Struct, kw_only=True):
    """What the live view shows of one model."""

    model: str
    requests_per_s: float | None
    errors: dict[str, float]          # status → share of the window's requests
    error_rate: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    latency_p50: float | None
    latency_p95: float | None
    tokens_per_s: float | None        # completion tokens
    queued: int
    in_flight: int
    rejected_429: float | None        # answered 429 in the window (budgets, limits, queue)
    prefix_hit_rate: float | None
    healthy: int
    ejected: int
    kv_cache: float | None
    requests: int                     # in the window (or ever, without an older sampling)


def _delta(new: dict[float, float], old: dict[float, float] | None) -> dict[float, float]:
    if old is None:
        return dict(new)
    return {b: v - old.get(b, 0.0) for b, v in new.items()}


def live(model: str, cur: ModelSample | None, old: ModelSample | None,
         seconds: float | None) -> ModelLive:
    """One model's figures: ``old`` is its sampling ``seconds`` before ``cur`` (None:
    none older, so no rates)."""
    cur = cur or ModelSample()
    base = old if seconds else None
    statuses = {s: v - (base.by_status.get(s, 0.0) if base else 0.0)
                for s, v in cur.by_status.items()}
    total = sum(statuses.values())
    errors = {s: n / total for s, n in sorted(statuses.items())
              if total > 0 and n > 0 and not s.startswith("2")}
    hist = {h: _delta(b, base.buckets.get(h) if base else None) for h, b in cur.buckets.items()}
    prompt = cur.prompt - (base.prompt if base else 0.0)
    cached = cur.cached - (base.cached if base else 0.0)

    def rate(now: float, before: float) -> float | None:
        return (now - before) / seconds if seconds and base is not None else None

    return ModelLive(
        model=model,
        requests_per_s=total / seconds if seconds and base is not None else None,
        errors=errors, error_rate=sum(errors.values()) if total > 0 else None,
        ttft_p50=quantile(0.5, hist.get("ttft", {})),
        ttft_p95=quantile(0.95, hist.get("ttft", {})),
        latency_p50=quantile(0.5, hist.get("latency", {})),
        latency_p95=quantile(0.95, hist.get("latency", {})),
        tokens_per_s=rate(cur.completion, base.completion if base else 0.0),
        queued=int(cur.queued), in_flight=int(cur.in_flight),
        rejected_429=statuses.get("429", 0.0) if total > 0 or base is not None else None,
        prefix_hit_rate=cached / prompt if prompt > 0 else None,
        healthy=int(cur.healthy), ejected=int(cur.ejected), kv_cache=cur.kv_cache,
        requests=int(total))


class Sampler:
    """The samplings of the last ``KEEP`` seconds, and the one to take rates against."""

    def __init__(self) -> None:
        self._kept: deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> Snapshot | None:
        """Keep ``snap``; the sampling to compare it with: the newest at least ``WINDOW``
        seconds older, else the oldest kept (a shorter window), else None."""
        while self._kept and snap.at - self._kept[0].at > KEEP:
            self._kept.popleft()
        older = [s for s in self._kept if s.at < snap.at - MIN_GAP]
        # Viewers polling together add one sampling a second, not one each.
        if not self._kept or snap.at - self._kept[-1].at >= MIN_GAP:
            self._kept.append(snap)
        if not older:
            return None
        far = [s for s in older if snap.at - s.at >= WINDOW]
        return far[-1] if far else older[0]
