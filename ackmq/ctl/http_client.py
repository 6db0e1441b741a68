"""`ackmq ctl --url`: a broker's management HTTP API (ackmq's or RabbitMQ's), with the
same answers as the admin socket's (socket_client.py), so the verbs print either."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from email.message import Message
from typing import Any
from urllib.parse import quote, urlsplit

from ackmq.ctl.errors import CtlError

Item = dict[str, Any]


class HttpSource:
    """A broker's management API (ackmq's or RabbitMQ's): `http://user:pass@host:port`."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"--url must be http(s)://user:pass@host:port, got {url!r}", 64)
        port = f":{parts.port}" if parts.port else ""
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        self.base = f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"
        creds = f"{parts.username or 'guest'}:{parts.password or 'guest'}"
        self.auth = "Basic " + base64.b64encode(creds.encode()).decode()
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Any:
        """The answer's JSON (None for an empty body)."""
        return self.exchange(method, path, body, headers)[0]

    def exchange(self, method: str, path: str, body: Any = None,
                 headers: dict[str, str] | None = None) -> tuple[Any, Message]:
        """The answer's JSON and its headers."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": self.auth, "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw, got = r.read(), r.headers
        except urllib.error.HTTPError as e:
            try:
                reason = json.loads(e.read()).get("reason") or e.reason
            except ValueError:
                reason = e.reason
            code = 69 if e.code == 404 else 77 if e.code == 401 else 70
            raise CtlError(f"{method} {path}: {e.code} {reason}", code) from None
        except OSError as e:
            raise CtlError(f"cannot reach {self.base}: {getattr(e, 'reason', e)}", 69) from None
        return (json.loads(raw) if raw.strip() else None), got

    def items(self, kind: str, vhost: str | None) -> list[Item]:
        path = f"/api/{kind}" if vhost is None else f"/api/{kind}/{quote(vhost, safe='')}"
        if vhost is not None and kind in ("connections", "channels"):
            path = f"/api/vhosts/{quote(vhost, safe='')}/{kind}"
        return list(self.call("GET", path))

    def node(self) -> dict[str, Any]:
        overview = self.call("GET", "/api/overview")
        node = self.call("GET", f"/api/nodes/{quote(overview['node'], safe='')}")
        return {"overview": overview, "node": node}

    def purge(self, vhost: str, name: str) -> None:
        try:
            self.call("DELETE", f"/api/queues/{quote(vhost, safe='')}/"
                                f"{quote(name, safe='')}/contents")
        except CtlError as e:  # 404: in the admin socket's words
            raise e if e.code != 69 else CtlError(
                f"Queue '{name}' in vhost '{vhost}' not found", 69) from None

    def delete_queue(self, vhost: str, name: str, if_empty: bool, if_unused: bool) -> int:
        path = f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}"
        try:
            before = self.call("GET", path)
        except CtlError as e:  # 404: in the admin socket's words
            raise e if e.code != 69 else CtlError("Queue not found", 64) from None
        q = [f"if-{k}=true" for k, on in (("empty", if_empty), ("unused", if_unused)) if on]
        self.call("DELETE", path + ("?" + "&".join(q) if q else ""))
        return int(before.get("messages") or 0)

    def close(self, name: str, reason: str) -> None:
        self.call("DELETE", f"/api/connections/{quote(name, safe='')}",
                  headers={"X-Reason": reason})

    def tracking(self, vhost: str, stream: str) -> list[Item]:
        """A stream's tracking rows (ackmq's /api/stream/tracking: RabbitMQ has none)."""
        try:
            return list(self.call("GET", f"/api/stream/tracking/{quote(vhost, safe='')}/"
                                         f"{quote(stream, safe='')}")["items"])
        except CtlError as e:  # 404: in rabbitmq-streams' words
            raise e if e.code != 69 else CtlError("The stream does not exist.", 70) from None
