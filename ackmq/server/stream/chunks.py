"""A Deliver built straight from the log's bytes (X1, X2): the records a subscription
reads (`StreamLog.read_spans`: the bytes read at once and where each record starts) go
into one chunk without a Python tuple or object per record. Records of a publisher
share their properties, exchange and routing key, so the message head (the AMQP 1.0
sections before the body) is found once per run of equal ones by comparing those bytes
in place; each body goes from the read buffer into the frame in the one join that the
chunk's crc is taken over. Records of other shapes (raw payloads, AMQP 1.0 bodies kept
encoded) are converted one by one, as `record_parts` converts them.
"""

from __future__ import annotations

from ackmq.protocol.stream.chunk import deliver_parts, size_prefix
from ackmq.protocol.stream.messages import data_header, record_head, record_parts
from ackmq.store.streamlog import REC

_unpack = REC.unpack_from
_REC_SIZE = REC.size


def _name(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def deliver_from_spans(subscription_id: int, spans: list[tuple[bytes, list[int]]],
                       budget: int, committed: int | None = None) -> tuple[bytes, int, int]:
    """(the Deliver frame, its first offset, its record count) of the records in
    `spans`, in order, as many as fit in `budget` bytes of chunk data (at least one);
    spans must hold at least one record. With `committed` (the stream's committed chunk
    id) a Deliver v2 naming at least the chunk's own first offset, else v1."""
    parts: list[bytes | memoryview] = []  # per record: size + head + data header, body
    append = parts.append
    size = count = 0
    first = stamp = 0
    # the run of equal (exchange, routing key, properties): their lengths, bytes, head
    klx = klk = klp = -1
    key = b""
    head: bytes | None = None
    pres: dict[int, bytes] = {}  # by body length: what goes before the body (per run)
    for data, positions in spans:
        view = memoryview(data)
        for p in positions:
            off, ts, lx, lk, lp, lb = _unpack(data, p)
            q = p + _REC_SIZE
            b = q + lx + lk + lp
            if lx != klx or lk != klk or lp != klp or not data.startswith(key, q):
                klx, klk, klp, key = lx, lk, lp, data[q:b]
                pres = {}
                x, k = _name(data[q:q + lx]), _name(data[q + lx:q + lx + lk])
                head = record_head(data[q + lx + lk:b], x, k)
                if head is None:
                    klx = -1  # not a head + data section record: no run
                    h, t = record_parts(data[q + lx + lk:b], data[b:b + lb], x, k)
                    n = len(h) + len(t)
                    if count and size + 4 + n > budget:
                        break
                    if not count:
                        first, stamp = off, ts
                    append(size_prefix(n))
                    append(h)
                    append(t)
                    size += 4 + n
                    count += 1
                    continue
            pre = pres.get(lb)  # the entry's size, the head, the data section's header
            if pre is None:
                assert head is not None
                dh = data_header(lb)
                pre = pres[lb] = size_prefix(len(head) + len(dh) + lb) + head + dh
            n = len(pre) + lb
            if count and size + n > budget:
                break
            if not count:
                first, stamp = off, ts
            append(pre)
            append(view[b:b + lb])
            size += n
            count += 1
        else:
            continue
        break
    if committed is not None:
        committed = max(committed, first)
    return deliver_parts(subscription_id, first, stamp, parts, count,
                         committed=committed), first, count
