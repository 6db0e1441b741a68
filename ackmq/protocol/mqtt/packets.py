"""MQTT control packets as plain objects, the same for 3.1, 3.1.1 and 5.0 (fields a
version does not have keep their defaults: `properties` is empty before 5.0, a reason
code 0). The decoder makes them from bytes; `encode()` makes bytes from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Auth", "ConnAck", "Connect", "Disconnect", "Packet", "PingReq", "PingResp", "Properties",
    "PubAck", "PubComp", "PubRec", "PubRel", "Publish", "PublishResponse", "SubAck",
    "SubOptions", "Subscribe", "UnsubAck", "Unsubscribe", "Will",
]

Properties = dict[str, Any]  # by property name (constants.PROPERTIES); repeatables: lists


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    client_id: str
    level: int = 4  # protocol level: 3 (3.1), 4 (3.1.1), 5 (5.0)
    clean_start: bool = True  # 3.1.1's clean session
    keep_alive: int = 0
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class ConnAck:
    reason_code: int = 0  # 3.1.1: the return code
    session_present: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0  # QoS 1 and 2 only
    properties: Properties = field(default_factory=dict)

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int = 0,
                 properties: Properties | None = None) -> None:
        self.topic, self.payload, self.qos, self.retain = topic, payload, qos, retain
        self.dup, self.packet_id = dup, packet_id
        self.properties = {} if properties is None else properties


@dataclass(slots=True)
class PublishResponse:
    """The one layout of PUBACK, PUBREC, PUBREL and PUBCOMP (a packet id, then in 5.0 a
    reason code and properties); each packet is its own subclass, told apart by type."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, packet_id: int, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id, self.reason_code = packet_id, reason_code
        self.properties = {} if properties is None else properties


class PubAck(PublishResponse):
    """QoS 1: the publish is accepted (or, in 5.0, refused with a reason code)."""

    __slots__ = ()


class PubRec(PublishResponse):
    """QoS 2, step 1: the publish is received."""

    __slots__ = ()


class PubRel(PublishResponse):
    """QoS 2, step 2: the publisher releases the packet id."""

    __slots__ = ()


class PubComp(PublishResponse):
    """QoS 2, step 3: the exchange is complete."""

    __slots__ = ()


@dataclass(slots=True)
class SubOptions:
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0: send retained, 1: only if new, 2: never


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    topics: list[tuple[str, SubOptions]]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class SubAck:
    packet_id: int
    reason_codes: list[int]  # 3.1.1: granted QoS or 0x80
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topics: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # 5.0 only
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (Connect | ConnAck | Publish | PubAck | PubRec | PubRel | PubComp | Subscribe
          | SubAck | Unsubscribe | UnsubAck | PingReq | PingResp | Disconnect | Auth)
