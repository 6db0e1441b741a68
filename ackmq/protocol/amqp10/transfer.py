"""A publisher's half of AMQP 1.0, compiled (mypyc): a transfer read, and the settled
disposition that answers it written, without the general codec. What clients send is a
small list of plain fields; anything else is None here and the general decoder's to read
(and refuse). frames.py's Decoder reads transfers with `read_transfer` too, so the two
cannot disagree; the server's fast lane (server/amqp10/transfers.py) takes the fields
without a Composite.

    field            codes taken (part 2.7.5)       else
    handle           43 52 70 (uint), mandatory     None
    delivery-id      40 43 52 70
    delivery-tag     40 a0 (vbin8)
    message-format   40 43 52 70
    settled, more    40 41 42 56 (boolean)
    rcv-settle-mode  40 50 (ubyte)
    state            40 (null)
    resume, aborted, batchable  40 41 42 56
"""

from __future__ import annotations

from typing import Final

TRANSFER_HEAD: Final = b"\x00\x53\x14\xc0"  # described by 0x14, a list8
DISPOSITION_HEAD: Final = b"\x00\x53\x15\xc0"
_FIELDS: Final = 11
_UINT: Final = 1  # a transfer field's kind, by position
_BOOL: Final = 2
_TAG: Final = 3  # delivery-tag
_MODE: Final = 4  # rcv-settle-mode
_STATE: Final = 5
_KINDS: Final = (_UINT, _UINT, _TAG, _UINT, _BOOL, _BOOL, _MODE, _STATE, _BOOL, _BOOL, _BOOL)


class Transfer:
    """A transfer's fields as read (a field's default where it is absent or null) and
    its payload: the bytes after the performative."""

    def __init__(self) -> None:
        self.handle = -1
        self.delivery_id: int | None = None
        self.delivery_tag: bytes | None = None
        self.message_format: int | None = None
        self.settled: bool | None = None
        self.more = False
        self.rcv_settle_mode: int | None = None
        self.resume = False
        self.aborted = False
        self.batchable = False
        self.payload = b""

    def values(self) -> list[object]:
        """The fields in the performative's order (the Composite's `values`)."""
        return [self.handle, self.delivery_id, self.delivery_tag, self.message_format,
                self.settled, self.more, self.rcv_settle_mode, None, self.resume,
                self.aborted, self.batchable]


def _uint(body: bytes, pos: int, stop: int) -> tuple[int, int]:
    """The uint (43, 52, 70) at `pos` and the position after it; (-1, pos) if not one."""
    code = body[pos]
    if code == 0x43:
        return 0, pos + 1
    if code == 0x52 and pos + 2 <= stop:
        return body[pos + 1], pos + 2
    if code == 0x70 and pos + 5 <= stop:
        return ((body[pos + 1] << 24) | (body[pos + 2] << 16) | (body[pos + 3] << 8)
                | body[pos + 4]), pos + 5
    return -1, pos


def _boolean(body: bytes, pos: int, stop: int) -> tuple[int, int]:
    """The boolean (41, 42, 56) at `pos` as 1 / 0, and the position after it; (-1, pos)
    if not one."""
    code = body[pos]
    if code == 0x41 or code == 0x42:
        return int(code == 0x41), pos + 1
    if code == 0x56 and pos + 2 <= stop and body[pos + 1] <= 1:
        return body[pos + 1], pos + 2
    return -1, pos


def read_transfer(body: bytes, start: int, end: int) -> Transfer | None:
    """The transfer performative at `body[start:]` (the frame's body ends at `end`),
    its payload what follows it; None when it is not a plain one."""
    if end - start < 6 or body[start:start + 4] != TRANSFER_HEAD:
        return None
    size = body[start + 4]
    count = body[start + 5]
    stop = start + 5 + size
    if count > _FIELDS or stop > end:
        return None
    t = Transfer()
    pos = start + 6
    for i in range(count):
        if pos >= stop:
            return None
        code = body[pos]
        if code == 0x40:  # null: the default
            pos += 1
            continue
        kind = _KINDS[i]
        if kind == _UINT:
            v, pos = _uint(body, pos, stop)
            if v < 0:
                return None
            if i == 0:
                t.handle = v
            elif i == 1:
                t.delivery_id = v
            else:
                t.message_format = v
        elif kind == _BOOL:
            b, pos = _boolean(body, pos, stop)
            if b < 0:
                return None
            if i == 4:
                t.settled = b == 1
            elif i == 5:
                t.more = b == 1
            elif i == 8:
                t.resume = b == 1
            elif i == 9:
                t.aborted = b == 1
            else:
                t.batchable = b == 1
        elif kind == _TAG:
            if code != 0xA0 or pos + 2 > stop:
                return None
            n = body[pos + 1]
            if pos + 2 + n > stop:
                return None
            t.delivery_tag = body[pos + 2:pos + 2 + n]
            pos += 2 + n
        elif kind == _MODE:
            if code != 0x50 or pos + 2 > stop:
                return None
            t.rcv_settle_mode = body[pos + 1]
            pos += 2
        else:  # state: only null is plain
            return None
    if pos != stop or t.handle < 0:
        return None
    t.payload = body[stop:end]
    return t


class Disposition:
    """A disposition's fields as read: `state` the code of an outcome without fields
    (accepted 0x24, rejected 0x25, released 0x26, modified 0x27, as a list0 or an empty
    list8), -1 for none."""

    def __init__(self) -> None:
        self.role = False
        self.first = -1
        self.last: int | None = None
        self.settled = False
        self.state = -1
        self.batchable = False


def read_disposition(body: bytes, start: int, end: int) -> Disposition | None:
    """The disposition at `body[start:end]` (nothing may follow it) when it is a plain
    one: what receivers send, and what answers a sender's transfers. None otherwise."""
    if end - start < 6 or body[start:start + 4] != DISPOSITION_HEAD:
        return None
    count = body[start + 5]
    stop = start + 5 + body[start + 4]
    if count > 6 or stop != end:
        return None
    d = Disposition()
    role_set = False
    pos = start + 6
    for i in range(count):
        if pos >= stop:
            return None
        code = body[pos]
        if code == 0x40:
            pos += 1
            continue
        if i == 1 or i == 2:  # first, last: uint
            v, pos = _uint(body, pos, stop)
            if v < 0:
                return None
            if i == 1:
                d.first = v
            else:
                d.last = v
        elif i == 4:  # state: an outcome with no fields
            if code != 0x00 or pos + 4 > stop or body[pos + 1] != 0x53:
                return None
            kind = body[pos + 2]
            if kind < 0x24 or kind > 0x27:
                return None
            if body[pos + 3] == 0x45:
                pos += 4
            elif (pos + 6 <= stop and body[pos + 3] == 0xC0 and body[pos + 4] == 1
                  and body[pos + 5] == 0):
                pos += 6
            else:
                return None
            d.state = kind
        else:  # role, settled, batchable: boolean
            b, pos = _boolean(body, pos, stop)
            if b < 0:
                return None
            if i == 0:
                d.role = b == 1
                role_set = True
            elif i == 3:
                d.settled = b == 1
            else:
                d.batchable = b == 1
    if pos != stop or not role_set or d.first < 0:
        return None
    return d


def uint(v: int) -> bytes:
    """A uint in its smallest encoding (types.py's)."""
    if v == 0:
        return b"\x43"
    if v < 256:
        return b"\x52" + bytes((v,))
    return b"\x70" + v.to_bytes(4, "big")


def frame_head(size: int, channel: int, frame_type: int = 0) -> bytes:
    """A frame's header (part 2.3.1): size, doff 2 (no extended header), type (0 AMQP,
    1 SASL), channel; every frame ackmq writes starts with one."""
    return (size.to_bytes(4, "big") + (b"\x02\x00" if frame_type == 0 else b"\x02\x01")
            + channel.to_bytes(2, "big"))


def settled_disposition(channel: int, role: bool, first: int, last: int | None,
                        state: bytes) -> bytes:
    """A settled disposition with an encoded `state` (batchable false), as
    `encode_frame` writes the performative, without building it: a publisher's
    outcomes go out in one per confirm."""
    fields = ((b"\x41" if role else b"\x42") + uint(first)
              + (uint(last) if last is not None else b"\x40") + b"\x41" + state + b"\x42")
    n = len(fields)
    if n + 1 < 256:
        body = b"\x00\x53\x15\xc0" + bytes((n + 1, 6)) + fields
    else:
        body = b"\x00\x53\x15\xd0" + (n + 4).to_bytes(4, "big") + b"\x00\x00\x00\x06" + fields
    return frame_head(8 + len(body), channel) + body


# after delivery-tag: message-format 0, settled (null / true), then more false,
# rcv-settle-mode null, state null, resume, aborted, batchable false
_UNSETTLED_TAIL: Final = b"\x43\x40\x42\x40\x40\x42\x42\x42"
_SETTLED_TAIL: Final = b"\x43\x41\x42\x40\x40\x42\x42\x42"


def delivery_frames(channel: int, handle: int, delivery_id: int, tag: bytes, settled: bool,
                    payload: bytes, max_frame_size: int) -> list[bytes]:
    """A delivery's transfer (message-format 0, `settled` true or absent) as frames.py's
    `encode_frames` gives it, without building the performative each time: a delivery
    is one frame unless the payload needs more (then encode_frames splits it)."""
    fields = (uint(handle) + uint(delivery_id) + b"\xa0" + bytes((len(tag),)) + tag
              + (_SETTLED_TAIL if settled else _UNSETTLED_TAIL))
    size = 8 + 6 + len(fields) + len(payload)
    if size > max_frame_size or len(tag) > 32:
        from ackmq.protocol.amqp10.composite import Composite
        from ackmq.protocol.amqp10.frames import encode_frames
        from ackmq.protocol.amqp10.types import UInt
        return encode_frames(channel, Composite(
            "transfer", handle=UInt(handle), delivery_id=UInt(delivery_id), delivery_tag=tag,
            message_format=UInt(0), settled=settled or None), payload, max_frame_size)
    return [frame_head(size, channel) + TRANSFER_HEAD + bytes((len(fields) + 1, 11)) + fields
            + payload]
