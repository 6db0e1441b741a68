"""Durable names of a vhost other than "/" in the one store.

The store keys exchanges, queues and bindings by name alone (it predates vhosts). A vhost
other than "/" reaches it through `VHostStore`, which stores every name as
`"\\0" + vhost + "\\0" + name`; "/" keeps plain names, so existing data dirs and the
default vhost's hot path are unchanged. Vhost names may not contain NUL. (A queue or
exchange in "/" whose name itself starts with NUL and holds a second NUL would be read
back as another vhost's: a known, documented limit.)
"""

from __future__ import annotations

from typing import Any

from ackmq.broker.storage import BindingDef, ExchangeDef, QueueDef

SEP = "\x00"


def qualify(vhost: str, name: str) -> str:
    return name if vhost == "/" else f"{SEP}{vhost}{SEP}{name}"


def split(stored: str) -> tuple[str, str]:
    """(vhost, name) of a stored name."""
    if stored.startswith(SEP):
        end = stored.find(SEP, 1)
        if end > 0:
            return stored[1:end], stored[end + 1:]
    return "/", stored


class VHostStore:
    """The `Store` as one vhost sees it: names in, names out, qualified in between."""

    def __init__(self, inner: Any, vhost: str) -> None:
        self.inner = inner
        self.prefix = f"{SEP}{vhost}{SEP}"

    def __getattr__(self, name: str) -> Any:  # commit, pending, read_message, read_body, ...
        return getattr(self.inner, name)

    def save_exchange(self, d: ExchangeDef) -> None:
        self.inner.save_exchange(ExchangeDef(self.prefix + d.name, d.type, d.durable,
                                             d.auto_delete, d.internal, d.arguments))

    def delete_exchange(self, name: str) -> None:
        self.inner.delete_exchange(self.prefix + name)

    def save_queue(self, d: QueueDef) -> None:
        self.inner.save_queue(QueueDef(self.prefix + d.name, d.durable, d.auto_delete,
                                       d.arguments))

    def delete_queue(self, name: str) -> None:
        self.inner.delete_queue(self.prefix + name)

    def _b(self, b: BindingDef) -> BindingDef:
        return BindingDef(self.prefix + b.source, self.prefix + b.destination,
                          b.destination_kind, b.routing_key, b.arguments)

    def save_binding(self, b: BindingDef) -> None:
        self.inner.save_binding(self._b(b))

    def delete_binding(self, b: BindingDef) -> None:
        self.inner.delete_binding(self._b(b))

    def add(self, queue: str, seq: int, exchange: str, routing_key: str,
            properties: bytes, body: bytes) -> int:
        return self.inner.add(self.prefix + queue, seq, exchange, routing_key, properties,
                              body)

    def remove(self, queue: str, seq: int) -> None:
        self.inner.remove(self.prefix + queue, seq)

    def delivered(self, queue: str, seq: int, delivery_count: int) -> None:
        self.inner.delivered(self.prefix + queue, seq, delivery_count)

    def read_queued(self, queue: str, seq: int) -> Any:
        return self.inner.read_queued(self.prefix + queue, seq)
