"""What ``llmgw fetch`` tells its task log: where it is, and how it ended.

On a Nomad node the fetch is a prestart task, and its log (the Nomad UI's Logs tab,
``nomad alloc logs ALLOC fetch``) is the one place someone watching a replica start
can see what it is doing. An hour into 140 GB, "is it moving, and how long is left"
must be answerable from there, without reading the progress file or guessing from
the allocation's age. So, when no terminal shows a progress bar:

* one line when the fetch starts — what, where, how much, and how much is already
  on disk from an earlier attempt;
* one line every ``interval`` (``LOG_INTERVAL``: a 140 GB fetch at 1 GB/s logs
  fourteen lines, at 100 MB/s a couple of hundred) — bytes on disk of the total, the
  rate over the last interval and the time left at the rate since the start (steadier
  than the last interval's). The lines come from a clock, not from arriving bytes, so
  a stalled transfer keeps logging, at 0B/s;
* one summary line at the end — bytes moved, time, mean rate, files and how they
  were checked, or that everything was already in the cache.

These go to standard output, which the Nomad UI shows first; warnings and the final
error go to standard error as every llmgw command writes them, and an error is
repeated on standard output so that neither log ends on a progress line. The byte
counts come from the same ``Meter`` as the progress file the control plane reads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from llmgw.catalog.units import format_size
from llmgw.weights.cache import Meter
from llmgw.weights.fetch import FetchResult

LOG_INTERVAL = 10.0   # seconds between two progress lines
Echo = Callable[[str], None]


def clock_text(seconds: float) -> str:
    """A duration as a person reads it: 45s, 2m05s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def rate_text(per_second: float) -> str:
    return f"{format_size(round(per_second))}/s"


class FetchLog:
    """The task log of one fetch: ``begin``, then a line every ``interval`` seconds from
    a thread of its own while the fetch runs (``running``), then ``summary``.

    A thread, not the fetch's progress callback: that runs only when bytes arrive, and
    the line that matters most is the one written when none do.
    """

    def __init__(self, meter: Meter, echo: Echo, *, interval: float = LOG_INTERVAL) -> None:
        self.meter = meter
        self._echo = echo
        self._interval = interval
        self._last = meter.started
        self._last_done = meter.base
        self._stop = threading.Event()

    def begin(self) -> str:
        m = self.meter
        size = format_size(m.total) if m.total is not None else "an unknown size"
        resumed = f", {format_size(m.base)} already on disk" if m.base else ""
        text = f"fetching {m.url} into {m.dest}: {size}{resumed}"
        self._echo(text)
        return text

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Write ``begin`` and then a line every interval until the block ends."""
        self.begin()
        self._stop.clear()
        ticker = threading.Thread(target=self._tick, name="llmgw-fetch-log", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            self._stop.set()
            ticker.join()

    def _tick(self) -> None:
        while not self._stop.wait(self._interval):
            self.line(self.meter.now())

    def line(self, now: float) -> str:
        """Write (and return) the progress line for ``now``."""
        p = self.meter.read(now)
        recent = max(0, p.done - self._last_done) / max(now - self._last, 1e-9)
        self._last, self._last_done = now, p.done
        if p.total:
            share = f"{format_size(p.done)} of {format_size(p.total)} ({p.percent:.1f}%)"
        else:
            share = f"{format_size(p.done)} of an unknown size"
        left = f", about {clock_text(p.eta)} left" if p.eta is not None and p.rate else ""
        text = f"fetched {share} at {rate_text(recent)}{left}"
        self._echo(text)
        return text

    def summary(self, results: Sequence[FetchResult], now: float | None = None) -> str:
        """The last line: what this run moved, or that it had nothing to move."""
        now = self.meter.now() if now is None else now
        size = sum(r.size for r in results)
        moved = sum(r.transferred for r in results)
        files = f"{len(results)} file{'s' if len(results) != 1 else ''}"
        if not moved:
            text = (f"already in the cache: {self.meter.dest} ({format_size(size)}, {files}); "
                    "nothing fetched")
        else:
            took = max(now - self.meter.started, 1e-9)
            text = (f"fetched {format_size(moved)} in {clock_text(took)} "
                    f"({rate_text(moved / took)}) into {self.meter.dest}: "
                    f"{format_size(size)} in {files}, {_checked(results)}")
        self._echo(text)
        return text


def _checked(results: Sequence[FetchResult]) -> str:
    verified = sum(1 for r in results if r.verified)
    if verified == len(results):
        return "every sha256 checked"
    if not verified:
        return "lengths checked only (the mirror has no .sha256 files)"
    return f"{verified} checked by sha256, {len(results) - verified} by length only"
