"""The lone ADD's frame (`lone_add_frame`, the confirm-each message's write) is byte for
byte the general encoder's: recovery reads both alike."""

from __future__ import annotations

import random

from ackmq.store.format import FrameWriter, encode_add, encode_synced, lone_add_frame


def general(synced: int, qid: int, seq: int, count: int, ex: bytes, rk: bytes,
            props: bytes, body: bytes) -> tuple[bytes, int]:
    fw = FrameWriter()
    if synced >= 0:
        fw.begin_record()
        encode_synced(fw.out, synced)
    at = fw.begin_record()
    encode_add(fw.out, qid, seq, count, ex, rk, props, body)
    return bytes(fw.finish()), at


def test_lone_add_frame_is_the_general_encoders_bytes() -> None:
    rnd = random.Random(39)
    for _ in range(2000):
        args = (rnd.choice([-1, 0, rnd.randrange(1 << 40)]), rnd.randrange(1 << 32),
                rnd.randrange(1 << 64), rnd.randrange(1 << 32),
                rnd.randbytes(rnd.randrange(0, 256)), rnd.randbytes(rnd.randrange(0, 256)),
                rnd.randbytes(rnd.randrange(0, 300)), rnd.randbytes(rnd.randrange(0, 5000)))
        assert lone_add_frame(*args) == general(*args), args
