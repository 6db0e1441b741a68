"""A queue entry as one record, for the spill (see `ackmq.store.spill`).

Everything needed to put the entry back exactly as it was: seq, flags, priority,
expiry, delivery count, and the message (exchange, routing key, raw properties, body).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from ackmq.broker.message import Message
from ackmq.broker.queue_type import QueueEntry
from ackmq.protocol.wire import U32 as _U32

_HDR = struct.Struct(">QBBdIBB")  # seq, flags, priority, expires_at, delivery_count, |ex|, |rk|
PERSISTED, REDELIVERED = 1, 2


def encode_entry(e: QueueEntry) -> bytes:
    m = e.message
    assert m is not None
    ex = m.exchange.encode()
    rk = m.routing_key.encode()
    flags = (PERSISTED if e.persisted else 0) | (REDELIVERED if e.redelivered else 0)
    exp = e.expires_at if e.expires_at is not None else math.nan
    return b"".join((_HDR.pack(e.seq, flags, e.priority, exp, e.delivery_count, len(ex), len(rk)),
                     ex, rk, _U32.pack(len(m.properties)), m.properties, m.body))


def decode_entry(rec: bytes, queue: Any, with_message: bool = True) -> QueueEntry:
    seq, flags, priority, exp, count, el, rl = _HDR.unpack_from(rec)
    p = _HDR.size
    if with_message:
        ex = rec[p:p + el].decode()
        p += el
        rk = rec[p:p + rl].decode()
        p += rl
        (pl,) = _U32.unpack_from(rec, p)
        p += 4
        msg: Message | None = Message(ex, rk, rec[p:p + pl], rec[p + pl:], trusted=True)
        e = QueueEntry(msg, seq, queue)
    else:
        p += el + rl
        (pl,) = _U32.unpack_from(rec, p)
        e = QueueEntry(None, seq, queue, size=len(rec) - p - 4 - pl, priority=priority)
    e.persisted = bool(flags & PERSISTED)
    e.redelivered = bool(flags & REDELIVERED)
    e.delivery_count = count
    e.expires_at = None if math.isnan(exp) else exp
    return e
