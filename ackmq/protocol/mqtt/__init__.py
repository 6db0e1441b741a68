"""Sans-IO MQTT 3.1, 3.1.1 and 5.0: packets (`packets.py`), the wire format (`codec.py`:
`Decoder`, `encode`, `MQTTError`), reason codes and properties as tables
(`constants.py`) and topics on amq.topic (`topics.py`). No sockets, no asyncio, no broker:
the server's MQTT connection drives the broker with these."""

from . import packets
from .codec import Decoder, MQTTError, encode, encode_properties, encode_publish
from .packets import *  # noqa: F403 (the packet classes, listed once in packets.__all__)

__all__ = ["Decoder", "MQTTError", "encode", "encode_properties", "encode_publish"]
__all__ += packets.__all__
