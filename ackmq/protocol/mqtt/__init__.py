"""Sans-IO MQTT 3.1, 3.1.1 and 5.0: packets (`packets.py`), the wire format (`codec.py`:
`Decoder`, `encode`, `MQTTError`), reason codes and properties as tables
(`constants.py`) and topics on amq.topic (`topics.py`). No sockets, no asyncio, no broker:
the server's MQTT connection drives the broker with these."""

from .codec import Decoder, MQTTError, encode, encode_properties, encode_publish
from .packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    SubOptions,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
)

__all__ = [
    "Auth", "ConnAck", "Connect", "Decoder", "Disconnect", "MQTTError", "Packet", "PingReq",
    "PingResp", "PubAck", "PubComp", "PubRec", "PubRel", "Publish", "SubAck", "SubOptions",
    "Subscribe", "UnsubAck", "Unsubscribe", "Will", "encode", "encode_properties",
    "encode_publish",
]
