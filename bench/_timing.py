"""What every benchmark here times with: one warm-up call, then wall-clock samples in ms."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    fn()  # warm up: imports, caches and the first allocation are not what is measured
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples
