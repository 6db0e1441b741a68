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

from ackmq.protocol.stream.chunk import deliver_pieces, size_prefix
from ackmq.protocol.stream.messages import data_header, record_head, record_parts
from ackmq.store.streamlog import REC

_unpack = REC.unpack_from
_REC_SIZE = REC.size
_LENS = 16  # where a record's lengths start (past its offset and timestamp)
# no record starts its lengths so (255, 255, 4 GiB of properties): no run open
_NO_RUN = b"\xff" * 6


def _name(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def deliver_from_spans(subscription_id: int, spans: list[tuple[bytes, list[int]]],
                       budget: int, committed: int | None = None
                       ) -> tuple[tuple[bytes, bytes], int, int]:
    """(the Deliver frame in two pieces (`deliver_pieces`), its first offset, its record
    count) of the records in
    `spans`, in order, as many as fit in `budget` bytes of chunk data (at least one);
    spans must hold at least one record. With `committed` (the stream's committed chunk
    id) a Deliver v2 naming at least the chunk's own first offset, else v1.

    A run of records equal but for offset, timestamp and body bytes (the usual: one
    publisher's messages of one size) costs one compare and one slice a record: the
    run's entries are `pre + body` with one `pre` (the entry's size, the message head,
    the data section's header), joined by `pre.join` in the one copy of the bodies."""
    runs: list[bytes] = []  # the chunk's data, run by run (most chunks: one run)
    size = count = 0  # of the runs closed
    first = stamp = 0
    # the open run: its records' bytes from the lengths to the end of the properties
    # (`same`), where a record's body starts and ends past its start, its `pre`, the
    # bodies (after a b"" for pre.join), how many more fit in the budget
    same = _NO_RUN
    hb = he = 0
    pre = b""
    bodies: list[bytes | memoryview] = [b""]
    room = 0
    # records of equal (exchange, routing key, properties) across body lengths: the head
    klx = klk = klp = -1
    key = b""
    head: bytes | None = None
    pres: dict[int, bytes] = {}  # by body length: what goes before the body
    full = False
    for data, positions in spans:
        view = memoryview(data)
        starts = data.startswith
        for p in positions:
            if starts(same, p + _LENS):  # the run goes on
                if not room:
                    full = True
                    break
                bodies.append(view[p + hb:p + he])
                room -= 1
                continue
            if len(bodies) > 1:  # the run ends
                runs.append(pre.join(bodies))
                size += (len(bodies) - 1) * (len(pre) + he - hb)
                count += len(bodies) - 1
                bodies = [b""]
                same = _NO_RUN
            off, ts, lx, lk, lp, lb = _unpack(data, p)
            q = p + _REC_SIZE
            b = q + lx + lk + lp
            if lx != klx or lk != klk or lp != klp or not starts(key, q):
                klx, klk, klp, key = lx, lk, lp, data[q:b]
                pres = {}
                x, k = _name(data[q:q + lx]), _name(data[q + lx:q + lx + lk])
                head = record_head(data[q + lx + lk:b], x, k)
                if head is None:
                    klx = -1  # not a head + data section record: converted alone
                    h, t = record_parts(data[q + lx + lk:b], data[b:b + lb], x, k)
                    n = len(h) + len(t)
                    if count and size + 4 + n > budget:
                        full = True
                        break
                    if not count:
                        first, stamp = off, ts
                    runs.append(size_prefix(n) + h + t)
                    size += 4 + n
                    count += 1
                    continue
            got = pres.get(lb)
            if got is None:
                assert head is not None
                dh = data_header(lb)
                got = pres[lb] = size_prefix(len(head) + len(dh) + lb) + head + dh
            pre = got
            n = len(pre) + lb
            if count and size + n > budget:
                full = True
                break
            if not count:
                first, stamp = off, ts
            same = data[p + _LENS:b]
            hb, he = b - p, b - p + lb
            room = max((budget - size - n) // n, 0)
            bodies.append(view[b:b + lb])
        if full:
            break
    if len(bodies) > 1:
        runs.append(pre.join(bodies))
        count += len(bodies) - 1
    if committed is not None:
        committed = max(committed, first)
    return deliver_pieces(subscription_id, first, stamp, runs, count,
                          committed=committed), first, count
