"""``python -m llmgw.testing.fake_nomad --port 4646 --fixture default``: run it by hand.

Serves until interrupted (Ctrl-C or SIGTERM) and prints its address first; ``--port 0``
picks a free port. Point ``NOMAD_ADDR`` (or llmgw's ``scheduler.nomad.address``) at it.
``--lenient`` and ``--no-auto-run`` mirror ``FakeNomad(strict=False)`` and
``FakeNomad(auto_run=False)``; check results stay ``pending`` since nothing here flips them.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from llmgw.testing.fake_nomad.fake import FakeNomad
from llmgw.testing.fake_nomad.fixtures import FIXTURES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.testing.fake_nomad",
                                     description="Run the fake Nomad server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4646)
    parser.add_argument("--fixture", choices=sorted(FIXTURES), default="default",
                        help="the set of client nodes to start with")
    parser.add_argument("--acl-token", default=None, help="require this management token")
    parser.add_argument("--lenient", action="store_true",
                        help="decode bodies like Nomad (ignore unknown keys) instead of strictly")
    parser.add_argument("--no-auto-run", dest="auto_run", action="store_false",
                        help="leave new allocations pending")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeNomad(FIXTURES[args.fixture](), acl_token=args.acl_token, strict=not args.lenient,
                   auto_run=args.auto_run, host=args.host, port=args.port) as nomad:
        print(f"fake Nomad listening on {nomad.address} with {len(nomad.nodes)} nodes",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
