"""`ackmq ctl`'s way to a local broker: its admin socket `<data dir>/ctl.sock` (mode
0600, served by server/ctl/), one JSON request line and one JSON reply line."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ackmq.ctl.errors import CtlError

Item = dict[str, Any]


def request(path: Path, verb: str, args: list[str], vhost: str = "/",
            timeout: float = 30.0, **extra: Any) -> dict[str, Any]:
    """One request to the admin socket; raises OSError if no broker listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(json.dumps({"verb": verb, "args": args, "vhost": vhost, **extra}).encode()
                  + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("the broker closed the admin socket without answering")
            buf += chunk
    reply: dict[str, Any] = json.loads(buf)
    return reply


class SocketSource:
    """The local admin socket (server/ctl/), as a source of the topology verbs."""

    def __init__(self, path: Any, request: Callable[..., dict[str, Any]] = request) -> None:
        self.path, self.request = path, request

    def _ok(self, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
        reply = self.request(self.path, verb, args, vhost)
        if not reply.get("ok"):
            raise CtlError(str(reply.get("error")), int(reply.get("code") or 1))
        return reply

    def items(self, kind: str, vhost: str | None) -> list[Item]:
        return self._ok("list_items", [kind] + (["all"] if vhost is None else []),
                        vhost or "/")["items"]

    def node(self) -> dict[str, Any]:
        return self._ok("node_status", [], "/")

    def purge(self, vhost: str, name: str) -> None:
        self._ok("purge_queue", [name], vhost)

    def delete_queue(self, vhost: str, name: str, if_empty: bool, if_unused: bool) -> int:
        flags = (["if-empty"] if if_empty else []) + (["if-unused"] if if_unused else [])
        return int(self._ok("delete_queue", [name, *flags], vhost)["count"])

    def close(self, name: str, reason: str) -> None:
        self._ok("close_connection", [name, reason], "/")

    def tracking(self, vhost: str, stream: str) -> list[Item]:
        return list(self._ok("stream_tracking", [stream], vhost)["items"])
