"""The first thing every engine process runs: tie it to llmgw's life, pin it, exec.

    python -m llmgw.scheduler.local.guard --parent PID [--cpus 0,1] -- ENGINE ARGV...

llmgw stops its engines itself (SIGTERM to the process group, then SIGKILL),
but a SIGKILLed llmgw runs no code, and an orphaned engine would keep its
port, its cores and gigabytes of memory with nothing routing to it. So before
the engine starts, this asks Linux to send it SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), which survives ``execve``; then it checks that the
parent is still the one that started it, because the parent may have died
before the request was made. The engine replaces this process (``execvp``):
no extra process stays behind.

Chosen over ``preexec_fn``, which runs Python between ``fork`` and ``exec`` in
a process whose other threads (the asyncio child watcher, executor threads)
may hold locks, and which Python documents as unsafe with threads.

Limits: the signal follows the *thread* that forked the child, which in llmgw
is the event-loop thread, alive as long as the server; it is Linux-only (on
other systems the engine is stopped only by a clean llmgw shutdown); and it
reaches the engine, not processes the engine starts itself (vLLM's workers are
in the same process group, which a clean stop kills as a whole).

This module imports only the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        print(f"llmgw guard: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}",
              file=sys.stderr)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: python -m llmgw.scheduler.local.guard --parent PID [--cpus LIST] "
              "-- ENGINE ARGV...", file=sys.stderr)
        return 2
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    parent, cpus = None, ""
    for flag, value in zip(opts[::2], opts[1::2], strict=False):
        if flag == "--parent":
            parent = int(value)
        elif flag == "--cpus":
            cpus = value
    if not command:
        print("llmgw guard: no engine command after --", file=sys.stderr)
        return 2
    _die_with_parent()
    if parent is not None and os.getppid() != parent:
        print("llmgw guard: llmgw exited before the engine started; not starting it",
              file=sys.stderr)
        return 1
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)  # noqa: S606 (replacing this process is the point)
    except OSError as exc:
        print(f"llmgw guard: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # unreachable: execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
