"""`ackmq ctl await_startup` and `await_online_nodes <count>` (rabbitmqctl's, SPEC M4):
a script that starts `ackmq serve` in the background waits here before its next ctl.

The broker opens its admin socket last, after recovery and every listener (server.py),
so the first answer on it means every port is up; until then the socket file may be
missing, stale (a previous run's) or not yet listening, and each of those is retried.
With `--url` the management API is polled instead. `-t/--timeout` in seconds as
rabbitmqctl (default 300); a timeout exits 70, as rabbitmqctl's await_online_nodes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ackmq.ctl.errors import CtlError

VERBS = ("await_startup", "await_online_nodes")
DEFAULT_TIMEOUT = 300.0
POLL = 0.1  # seconds between two tries
EX_TIMEOUT = 70
EX_DATAERR = 65  # rabbitmqctl's code for a bad argument


def add_parsers(sub: Any) -> None:
    for verb in VERBS:
        p = sub.add_parser(verb)
        if verb == "await_online_nodes":
            p.add_argument("count", help="how many nodes must be up (ackmq: one node)")
        p.add_argument("-t", "--timeout", type=float, default=DEFAULT_TIMEOUT,
                       help=f"seconds to wait (default {DEFAULT_TIMEOUT:g})")


def _ping(args: argparse.Namespace, path: Path) -> str:
    """The node's name once the broker answers; OSError or CtlError(69) until then."""
    if args.url:
        from ackmq.ctl.http_client import HttpSource
        return str(HttpSource(args.url, timeout=5).call("GET", "/api/overview")["node"])
    from ackmq.ctl.socket_client import request
    reply = request(path, "node_status", [], timeout=30)
    if not reply.get("ok"):
        raise CtlError(str(reply.get("error")), int(reply.get("code") or 1))
    return str((reply.get("overview") or {}).get("node") or "")


def wait(args: argparse.Namespace, path: Path) -> str | None:
    """The node's name, or None when `args.timeout` passes without an answer."""
    deadline = time.monotonic() + max(0.0, args.timeout)
    while True:
        try:
            return _ping(args, path)
        except CtlError as e:
            if e.code != 69:  # it answered, with a refusal: waiting will not help
                raise
        except (OSError, ValueError):  # no socket yet, refused, half-written reply
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL)


def run(args: argparse.Namespace, path: Path) -> int:
    where = args.url or f"admin socket {path}"
    if args.verb == "await_online_nodes":
        try:
            count = int(args.count)
        except ValueError:
            count = 0
        if count < 1:
            print("Error (argument validation): Bad argument: Argument must be a "
                  "positive integer", file=sys.stderr)
            return EX_DATAERR
    start = time.monotonic()
    try:
        node = wait(args, path)
    except CtlError as e:
        print(f"Error:\n{e.text}", file=sys.stderr)
        return e.code
    if node is None:
        print(f"Error:\ntimed out after {args.timeout:g} seconds waiting for the broker "
              f"to start ({where})", file=sys.stderr)
        return EX_TIMEOUT
    if args.verb == "await_startup":
        return 0
    if not args.quiet:
        print(f"Will wait for at least {count} nodes to join the cluster of {node}. "
              f"Timeout: {args.timeout:g} seconds.")
    if count == 1:
        return 0
    # ackmq is one node: no other will join
    time.sleep(max(0.0, args.timeout - (time.monotonic() - start)))
    print(f"Error:\nError: timed out while waiting. Not enough nodes joined {node}'s "
          "cluster.", file=sys.stderr)
    return EX_TIMEOUT
