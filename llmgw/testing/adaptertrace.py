"""A trace of chat sessions over many LoRA adapters, with Zipf-distributed popularity.

Fine-tune traffic is skewed: a few adapters take most requests and a long tail
is asked for now and then (the shape S-LoRA and Punica evaluate against, a
power law over adapters). ``zipf_weights`` gives adapter ``k`` (from 1) the
weight ``1 / k**s``; each session draws its adapter from them, arrives as a
Poisson process, and has a few turns separated by the user's thinking time,
each turn resending the conversation so far — what chat clients do, and what
makes prefix affinity *within an adapter* worth anything.

Deterministic for a seed, pure (no clock, no I/O): the replay
(``bench/adapter_replay.py``) and the tests drive the same trace.
"""

from __future__ import annotations

import bisect
import itertools
import random

import msgspec


class AdapterSession(msgspec.Struct, frozen=True, kw_only=True):
    start: float                  # seconds from the trace's start
    adapter: str
    system: str
    questions: list[str]
    think: list[float]            # seconds after each answer before the next question
    max_tokens: int


def zipf_weights(n: int, s: float) -> list[float]:
    """Normalised weights of ranks 1..n under Zipf's law with exponent ``s``."""
    raw = [1.0 / (k ** s) for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def adapter_names(n: int, prefix: str = "ft") -> list[str]:
    """``n`` adapter names, most popular first."""
    return [f"{prefix}-{k:03d}" for k in range(1, n + 1)]


def make_trace(seed: int, *, adapters: list[str], s: float = 1.1, rate: float = 4.0,
               duration: float = 60.0, turns: tuple[int, int] = (2, 5),
               think: float = 1.0, system_words: int = 120,
               max_tokens: int = 24) -> list[AdapterSession]:
    """Sessions arriving at ``rate`` per second for ``duration`` seconds, each on an
    adapter drawn by Zipf(``s``) popularity, ranked in the order of ``adapters``."""
    rng = random.Random(seed)  # noqa: S311 (a reproducible trace, not a secret)
    cumulative = list(itertools.accumulate(zipf_weights(len(adapters), s)))
    out: list[AdapterSession] = []
    t = 0.0
    index = 0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        index += 1
        rank = min(bisect.bisect_left(cumulative, rng.random() * cumulative[-1]),
                   len(adapters) - 1)
        n = rng.randint(*turns)
        words = " ".join(f"w{rng.randrange(5000)}" for _ in range(system_words))
        out.append(AdapterSession(
            start=t, adapter=adapters[rank],
            system=f"Session {seed}-{index} for {adapters[rank]}. {words}",
            questions=[f"question {q} of session {index}: "
                       + " ".join(f"q{rng.randrange(900)}" for _ in range(12))
                       for q in range(n)],
            think=[rng.expovariate(1.0 / think) for _ in range(n)],
            max_tokens=max_tokens))


def popularity(trace: list[AdapterSession]) -> dict[str, int]:
    """Requests per adapter in ``trace``, most asked first."""
    counts: dict[str, int] = {}
    for s in trace:
        counts[s.adapter] = counts.get(s.adapter, 0) + len(s.questions)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
