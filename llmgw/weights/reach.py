"""Where the source check may go: the hosts and local roots a model can come from.

Pure: hosts, addresses and paths in, a verdict out; ``weights.check`` asks it
before every connection (each redirect hop included, and each address a name
resolves to) and before it looks at a local path.

``POST /api/v1/source-check`` makes the server fetch what a caller names, so
without limits it is a probe of the server's own network: whether
``http://127.0.0.1:5432/`` is open, what a metadata service at
``169.254.169.254`` says, whether ``/etc/shadow`` exists. A model comes
from few places — the Hugging Face Hub (whose address the operator sets,
never the caller), the mirror, an HTTP server holding weights, a path of the
embedded mode — so the check goes only there.

**Hosts.** In order, the first rule that matches decides:

1. ``deny_hosts`` (names, addresses or networks such as ``10.8.0.0/16``): never.
2. The configured ``mirror``'s host and ``allow_hosts``: always, whatever
   address they have. The mirror is usually on a private address, and it is
   where a cluster's models come from, so it must pass without a setting.
3. Loopback, link-local (cloud metadata at ``169.254.169.254`` included),
   private (RFC 1918, ``fc00::/7``), shared (``100.64.0.0/10``), unspecified,
   multicast and reserved addresses: denied. That is where a server's own
   database, Nomad and Consul agents and metadata service answer; a model
   server there is the exception, named in ``allow_hosts``.
4. Any other (public) address: allowed — a model on a vendor's HTTP server.

A host is judged by every address it resolves to (one denied address denies
it), and a numeric host is read the way the resolver would read it:
``0x7f000001``, ``2130706433``, ``0177.0.0.1`` and ``127.1`` are all
``127.0.0.1`` (``numeric_host``), so no spelling walks past rule 3.

**Local paths.** On a server that listens on a loopback address only (the
embedded mode on a laptop, the default), every caller is on the machine and
may check any path as before. On one that listens beyond it, a path is
checked only under ``local_roots`` and ``~`` is not expanded: a path outside
is refused with the same words whether or not it exists. The rule follows
the listener rather than each request's address because a reverse proxy on
the same host makes every remote caller look local.
"""

from __future__ import annotations

import ipaddress
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Rule 3's ranges, beyond what ``ipaddress``'s is_private etc. already say.
_SHARED = ipaddress.ip_network("100.64.0.0/10")


def numeric_host(host: str) -> Address | None:
    """``host`` as an address if it is one in any spelling a resolver accepts: dotted
    quads, IPv6 (bracketed or not), and inet_aton's forms — 1 to 4 parts, each
    decimal, octal (leading 0) or hex (0x). None for a name."""
    h = host.strip().rstrip(".").strip("[]")
    if not h:
        return None
    try:
        address = ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        pass
    else:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return address.ipv4_mapped
        return address
    parts = h.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for p in parts:
        try:
            if p.lower().startswith("0x"):
                values.append(int(p[2:] or "0", 16))
            elif len(p) > 1 and p.startswith("0"):
                values.append(int(p, 8))
            else:
                values.append(int(p, 10))
        except ValueError:
            return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = 0
    for v in head:
        number = number * 256 + v
    number = number * 256 ** (4 - len(head)) + last
    return ipaddress.IPv4Address(number)


def _internal(address: Address) -> bool:
    return (address.is_loopback or address.is_link_local or address.is_private
            or address.is_unspecified or address.is_multicast or address.is_reserved
            or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED))


@dataclass(frozen=True)
class Reach:
    """The source check's limits, from ``source_check:`` and the mirror."""

    allow_names: frozenset[str] = frozenset()
    allow_networks: tuple[Network, ...] = ()
    deny_names: frozenset[str] = frozenset()
    deny_networks: tuple[Network, ...] = ()
    local_roots: tuple[str, ...] = ()
    any_local_path: bool = True

    @classmethod
    def of(cls, *, allow_hosts: Iterable[str] = (), deny_hosts: Iterable[str] = (),
           mirror_host: str | None = None, local_roots: Sequence[str] = (),
           any_local_path: bool = True) -> Reach:
        allow = [*allow_hosts, *([mirror_host] if mirror_host else [])]
        a_names, a_nets = _split(allow, "allow_hosts")
        d_names, d_nets = _split(deny_hosts, "deny_hosts")
        roots = tuple(posixpath.normpath(r) for r in local_roots)
        for r in roots:
            if not posixpath.isabs(r):
                raise ValueError(f"source_check.local_roots: {r!r} is not an absolute path")
        return cls(allow_names=a_names, allow_networks=a_nets, deny_names=d_names,
                   deny_networks=d_nets, local_roots=roots, any_local_path=any_local_path)

    def host_allowed(self, host: str, addresses: Sequence[Address]) -> bool:
        """Whether ``host``, resolving to ``addresses`` (all of them), may be reached."""
        name = host.strip().rstrip(".").strip("[]").lower()
        numeric = numeric_host(name)
        every = [*addresses, *([numeric] if numeric is not None else [])]
        if not every:
            return False
        if name in self.deny_names or any(a in n for a in every for n in self.deny_networks):
            return False
        if name in self.allow_names or (numeric is not None and str(numeric) in
                                        self.allow_names):
            return True
        if all(any(a in n for n in self.allow_networks) for a in every):
            return True
        return not any(_internal(a) for a in every)

    def path_allowed(self, path: str) -> bool:
        """Whether a local path may be looked at; ``path`` is absolute and resolved
        (symbolic links, ``..``) by the caller, or ``~``-prefixed."""
        if self.any_local_path:
            return True
        if path.startswith("~") or not posixpath.isabs(path):
            return False
        clean = posixpath.normpath(path)
        return any(clean == r or clean.startswith(r.rstrip("/") + "/")
                   for r in self.local_roots)


def _split(hosts: Iterable[str], where: str) -> tuple[frozenset[str], tuple[Network, ...]]:
    names: set[str] = set()
    nets: list[Network] = []
    for h in hosts:
        text = h.strip().lower()
        if "/" in text:
            try:
                nets.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ValueError(f"source_check.{where}: {h!r} is neither a host nor a "
                                 "network such as 10.8.0.0/16") from None
            continue
        numeric = numeric_host(text)
        names.add(str(numeric) if numeric is not None else text.rstrip(".").strip("[]"))
        if numeric is not None:
            nets.append(ipaddress.ip_network(numeric))
    return frozenset(names), tuple(nets)
