"""The properties of a dead-lettered message, as RabbitMQ 3.10's rabbit_dead_letter
writes them: an `x-death` entry (a new one first, or the matching queue+reason entry
bumped), `x-first-death-*` on the first death, `CC` dropped when the queue has its own
dead-letter routing key, `expiration` moved into the entry as `original-expiration`.

Like RabbitMQ's `set_table_value`, the edit leaves the headers table sorted by key;
every other entry keeps its exact encoding (type and bytes), as RabbitMQ keeps
`{Key, Type, Value}`. The bytes are spliced by protocol helpers, never re-encoded whole.
"""

from __future__ import annotations

import datetime
from typing import Any

from ackmq.broker.message import Message
from ackmq.protocol.amqp.properties import encode_entry, header_entries, properties_edit


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def dead_letter_properties(msg: Message, queue: str, reason: str,
                           drop_cc: bool) -> tuple[bytes, list[dict[str, Any]]]:
    """(the new raw properties, the new x-death list) for `msg` leaving `queue`."""
    raw = msg.properties
    entries = dict(header_entries(raw))
    info: dict[str, Any] = {
        "reason": reason, "queue": queue,
        "time": datetime.datetime.now(tz=datetime.UTC).replace(microsecond=0),
        "exchange": msg.exchange, "routing-keys": msg.routing_keys,
    }
    expiration = msg.view.expiration
    if expiration is not None:
        info["original-expiration"] = _text(expiration)
    old = (msg.headers or {}).get("x-death") if b"x-death" in entries else None
    if not isinstance(old, list):  # the first death (an x-death of another type: replaced)
        deaths = [{"count": 1, **info}]
        for key, value in (("x-first-death-reason", reason), ("x-first-death-queue", queue),
                           ("x-first-death-exchange", msg.exchange)):
            entries[key.encode()] = encode_entry(key, value)
    else:
        tables = [d for d in old if isinstance(d, dict)]
        match = next((d for d in tables if _text(d.get("queue")) == queue
                      and _text(d.get("reason")) == reason), None)
        if match is None:
            event = {"count": 1, **info}
        else:
            event = dict(match)
            event["count"] = int(event.get("count", 1)) + 1
        deaths = [dict(sorted(event.items())), *(d for d in tables if d is not match)]
    entries[b"x-death"] = encode_entry("x-death", deaths)
    if drop_cc:
        entries.pop(b"CC", None)
    return properties_edit(raw, [entries[k] for k in sorted(entries)],
                           drop=("expiration",)), deaths
