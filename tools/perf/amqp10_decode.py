"""CPU per AMQP 1.0 message on the broker's receive path, in process: decode one transfer
performative, read its fields, decode a durable 100-byte message, build one disposition.
Deterministic enough to compare two checkouts on a busy machine:

    PYTHONPATH=<checkout> python -m tools.perf.amqp10_decode
"""

from __future__ import annotations

import timeit

from ackmq.protocol.amqp10 import Composite
from ackmq.protocol.amqp10.composite import from_described
from ackmq.protocol.amqp10.message import DATA, Message10, decode_message
from ackmq.protocol.amqp10.types import UInt, decode

payload = Message10(header=Composite("header", durable=True), body=[(DATA, b"x" * 100)]).encode()
perf = Composite("transfer", handle=UInt(0), delivery_id=UInt(7), delivery_tag=b"\x00\x00\x00\x07",
                 message_format=UInt(0), settled=False, more=False).encode_amqp()
def one():
    d, _ = decode(perf)
    p = from_described(d)
    _ = (p.handle, p.delivery_id, p.settled, p.more, p.aborted)
    decode_message(payload)
    Composite("disposition", role=True, first=UInt(7), settled=True)
N = 50000
t = min(timeit.repeat(one, number=N, repeat=5))
print(f"{t / N * 1e6:.2f} us per transfer decode + message decode + one disposition")
