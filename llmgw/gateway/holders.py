"""Lease holder names that say which process holds a lease, so a dead one can be told.

A store lease (the batch worker's, the scaler's) outlives a process that is
killed: nobody releases it, and the next holder waits out its ttl. When the
process that comes back runs on the same machine, it can do better: the
holder name carries the machine's boot id and the process's pid namespace
besides its host name and pid, and a holder of *this* boot and namespace
whose pid no longer exists is certainly gone — its lease may be released at
once.

What may never happen is the opposite: a live holder judged gone, so that
two workers send the same batch lines. Hence every doubt answers "alive":
another machine, another container (another pid namespace: its pids mean
nothing here), an unreadable ``/proc``, a name of another shape, or a pid
that exists again (reused by some other process: the lease is then waited
out as before).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _machine() -> str:
    """This boot of this machine and this pid namespace; "" if they cannot be read."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot.replace('-', '')[:16]}.{namespace:x}"


def holder_name(tag: str) -> str:
    """The holder name of this process (``tag`` tells apart holders within it)."""
    return f"{socket.gethostname()}:{os.getpid()}:{tag}@{_machine()}"


def is_gone(holder: str) -> bool:
    """Whether ``holder`` names a process of this machine's boot and pid namespace that
    no longer exists; False whenever that cannot be known for certain."""
    head, sep, machine = holder.rpartition("@")
    if not sep or not machine or machine != _machine():
        return False
    host, _, rest = head.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:             # it exists, as another user's
        return False
    return False
