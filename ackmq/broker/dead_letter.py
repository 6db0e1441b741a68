"""The properties of a dead-lettered message, as RabbitMQ 3.10's rabbit_dead_letter
writes them: an `x-death` entry (a new one first, or the matching queue+reason entry
bumped), `x-first-death-*` on the first death, `CC` dropped when the queue has its own
dead-letter routing key, `expiration` moved into the entry as `original-expiration`.

Like RabbitMQ's `set_table_value`, the edit leaves the headers table sorted by key;
every other entry keeps its exact encoding (type and bytes), as RabbitMQ keeps
`{Key, Type, Value}`, earlier x-death entries included (only the bumped one is re-sorted
and gets its new count), so a value ackmq could not re-encode (a key that is not UTF-8, a
timestamp past year 9999) is carried as it came. The bytes are spliced by protocol
helpers, never re-encoded whole.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from ackmq.broker.message import Message
from ackmq.protocol.amqp.properties import header_entries, properties_edit
from ackmq.protocol.amqp.table import (
    array_items,
    encode_array,
    encode_entry,
    encode_value,
    table_items,
)


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _key(name: bytes) -> bytes:
    return bytes((len(name),)) + name


def _table(entries: Iterable[bytes]) -> bytes:
    data = b"".join(entries)
    return len(data).to_bytes(4, "big") + data


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
    raw_old = array_items(entries[b"x-death"]) if isinstance(old, list) else None
    if raw_old is None:  # the first death (an x-death of another type: replaced)
        deaths = [{"count": 1, **info}]
        for key, value in (("x-first-death-reason", reason), ("x-first-death-queue", queue),
                           ("x-first-death-exchange", msg.exchange)):
            entries[key.encode()] = encode_entry(key, value)
        entries[b"x-death"] = encode_entry("x-death", deaths)
    else:
        # decoded to find the matching entry, written back from the bytes that came
        assert isinstance(old, list)  # raw_old is not None only then
        pairs = list(zip(old, raw_old, strict=True))
        match = next((i for i, (d, _raw) in enumerate(pairs) if isinstance(d, dict)
                      and _text(d.get("queue")) == queue and _text(d.get("reason")) == reason),
                     None)
        if match is None:
            event = {"count": 1, **info}
            raw_event = encode_value(dict(sorted(event.items())))
        else:
            d, raw_match = pairs.pop(match)
            event = dict(d)
            event["count"] = int(event.get("count", 1)) + 1
            kept = [(k, e) for k, e in table_items(raw_match) or [] if k != b"count"]
            kept.append((b"count", encode_entry("count", event["count"])))
            raw_event = b"F" + _table(e for _k, e in sorted(kept))
        deaths = [dict(sorted(event.items())), *(d for d, _raw in pairs)]
        entries[b"x-death"] = _key(b"x-death") + encode_array(
            [raw_event, *(item for _d, item in pairs)])
    if drop_cc:
        entries.pop(b"CC", None)
    return properties_edit(raw, [entries[k] for k in sorted(entries)],
                           drop=("expiration",)), deaths
