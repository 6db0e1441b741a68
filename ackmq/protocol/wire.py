"""Network-order integers, the one definition every codec reads and writes them by
(AMQP 0-9-1 tables, the firehose's copy, MQTT, the stream protocol): a `struct.Struct`
each, built once at import.
"""

from __future__ import annotations

import struct

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
