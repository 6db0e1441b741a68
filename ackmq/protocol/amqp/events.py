"""Events the Decoder emits and the errors it raises.

Events are plain slotted dataclasses so the server's dispatch is an attribute read and
an isinstance check, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeAlias, TypeVar

from mypy_extensions import mypyc_attr
from pamqp.base import Frame
from pamqp.commands import Basic

from .constants import FRAME_ERROR, reply_text


@dataclass(slots=True)
class ProtocolHeader:
    """The client sent b"AMQP\\x00\\x00\\x09\\x01"; the server answers connection.start."""


@dataclass(slots=True)
class Method:
    """A method frame that carries no content (everything except the four below)."""

    channel: int
    method: Frame

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, channel: int, method: Frame) -> None:
        self.channel, self.method = channel, method


@dataclass(slots=True)
class Publish:
    """basic.publish with its content header and all its body frames."""

    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    properties: bytes
    body: bytes

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, channel: int, exchange: str, routing_key: str, mandatory: bool,
                 immediate: bool, properties: bytes, body: bytes) -> None:
        self.channel, self.exchange, self.routing_key = channel, exchange, routing_key
        self.mandatory, self.immediate = mandatory, immediate
        self.properties, self.body = properties, body


ContentMethod = Basic.Deliver | Basic.GetOk | Basic.Return
"""The methods that carry content to a client."""


class DecodedGetOk(Protocol):
    """basic.get-ok as decoded: every field set (pamqp types its fields Optional because
    its constructors default them; a decoded frame has them all)."""

    @property
    def delivery_tag(self) -> int: ...
    @property
    def redelivered(self) -> bool: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...


class DecodedDeliver(DecodedGetOk, Protocol):
    """basic.deliver as decoded: get-ok's fields and the consumer tag."""

    @property
    def consumer_tag(self) -> str: ...


class DecodedReturn(Protocol):
    """basic.return as decoded: every field set."""

    @property
    def reply_code(self) -> int: ...
    @property
    def reply_text(self) -> str: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...


class DecodedReject(Protocol):
    """basic.reject as decoded (pamqp types its tag Optional)."""

    @property
    def delivery_tag(self) -> int: ...
    @property
    def requeue(self) -> bool: ...


class DecodedCancel(Protocol):
    """basic.cancel as decoded (pamqp types its tag Optional)."""

    @property
    def consumer_tag(self) -> str: ...
    @property
    def nowait(self) -> bool: ...


class DecodedFlow(Protocol):
    """channel.flow as decoded (pamqp types `active` Optional)."""

    @property
    def active(self) -> bool: ...


M = TypeVar("M")


@mypyc_attr(native_class=False)  # a generic slotted dataclass: mypyc cannot make it native
@dataclass(slots=True)
class Content(Generic[M]):
    """basic.deliver / basic.get-ok / basic.return with its content (client side).

    Generic in its method so that a reader that knows which it has (a listener's
    on_deliver, on_return) gets that method's fields typed; no cost per instance."""

    channel: int
    method: M
    properties: bytes
    body: bytes

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, channel: int, method: M, properties: bytes, body: bytes) -> None:
        self.channel, self.method, self.properties, self.body = channel, method, properties, body


@dataclass(slots=True)
class Heartbeat:
    """A heartbeat frame on channel 0."""


@dataclass(slots=True)
class ChannelFault:
    """A channel-level error found while decoding; the server closes just that channel.

    `reply_text` already carries RabbitMQ's "NAME - " prefix, ready for channel.close.
    """

    channel: int
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


# a string: compiled, `Content` (not native) cannot be subscripted at run time
Event: TypeAlias = (
    "ProtocolHeader | Method | Publish | Content[ContentMethod] | Heartbeat | ChannelFault")


class FrameError(Exception):
    """A connection-level protocol error: send connection.close with these and stop.

    After raising it the Decoder is dead (every later feed raises it again).
    """

    events: list[Event]  # set by Decoder.feed: the good events decoded before the error

    def __init__(
        self, reply_code: int, detail: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text(reply_code, detail)
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(reply_code, self.reply_text, class_id, method_id)


class BadProtocolHeader(FrameError):
    """The first 8 bytes are not AMQP 0-9-1's header: reply PROTOCOL_HEADER and close.
    `head`: the first bytes received (up to 16), to name the protocol they belong to."""

    def __init__(self, received: bytes, head: bytes = b"") -> None:
        self.received = received
        self.head = head or received
        # the text does not quote the bytes: how many arrived depends on how TCP cut them
        # (a refusal may come at the first byte), and the text is never sent
        super().__init__(FRAME_ERROR, "bad protocol header")
