"""Messages: `Message` as a consumer receives it, `OutboundMessage` as a producer sends
it (and gets it back on a nack or a return, ready to publish again)."""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

from ackmq.protocol.amqp import PropertiesView
from ackmq.protocol.amqp.client_codec import encode_basic_properties, properties_dict
from ackmq.protocol.amqp.constants import DELIVERY_COUNT_HEADER, SEQ_HEADER

if TYPE_CHECKING:
    from .consumer import BaseConsumer

DLQ_CAUSE_HEADER = "x-ackmq-dlq-cause"

# delivery states inside a session
BUFFERED, DELAYED, DELIVERED, SETTLED = 0, 1, 2, 3


class Message:
    """A delivery. `delivery_count` is JMSXDeliveryCount: 1 on the first delivery.

    `headers` are the publisher's: on ackmq the two headers the client asks the broker
    to add (`x-ackmq-seq`, `x-delivery-count`) are taken out and shown as `seq` and
    `delivery_count`; on RabbitMQ nothing is taken out.
    """

    __slots__ = ("body", "exchange", "routing_key", "redelivered", "delivery_tag",
                 "raw_properties", "redelivery_count", "state", "consumer", "generation",
                 "_view", "_headers", "_seq", "_broker_headers", "__weakref__")

    def __init__(self, body: bytes, exchange: str, routing_key: str, redelivered: bool,
                 delivery_tag: int, raw_properties: bytes, consumer: BaseConsumer | None,
                 generation: int, broker_headers: bool) -> None:
        self.body = body
        self.exchange = exchange
        self.routing_key = routing_key
        self.redelivered = redelivered
        self.delivery_tag = delivery_tag
        self.raw_properties = raw_properties
        self.consumer = consumer
        self.generation = generation
        self.redelivery_count = 0
        self.state = BUFFERED
        self._view: PropertiesView | None = None
        self._headers: dict[str, Any] | None = None
        self._seq: int | None = None
        self._broker_headers = broker_headers

    # -- properties --------------------------------------------------------------------
    @property
    def view(self) -> PropertiesView:
        if self._view is None:
            self._view = PropertiesView(self.raw_properties)
        return self._view

    def _split_headers(self) -> dict[str, Any]:
        headers = dict(self.view.headers or {})
        if self._broker_headers:
            seq = headers.pop(SEQ_HEADER, None)
            headers.pop(DELIVERY_COUNT_HEADER, None)
            self._seq = seq if isinstance(seq, int) else None
        else:
            seq = headers.get(SEQ_HEADER)
            self._seq = seq if isinstance(seq, int) else None
        self._headers = headers
        return headers

    @property
    def headers(self) -> dict[str, Any]:
        """Application headers as the publisher set them."""
        headers = self._headers
        if headers is None:
            headers = self._split_headers()
        return headers

    @property
    def seq(self) -> int | None:
        """ackmq's per-queue sequence number (x-ackmq-seq), None on RabbitMQ."""
        if self._headers is None:
            self._split_headers()
        return self._seq

    @property
    def properties(self) -> dict[str, Any]:
        """The basic properties present (content_type, delivery_mode, message_id, ...)."""
        return properties_dict(self.raw_properties)

    @property
    def message_id(self) -> str | None:
        return self.view.message_id

    @property
    def delivery_count(self) -> int:
        """JMSXDeliveryCount: 1 + the redeliveries known (broker-kept on ackmq)."""
        return self.redelivery_count + 1

    # -- acknowledgement ---------------------------------------------------------------
    def acknowledge(self) -> None:
        """CLIENT: ack every delivered-unacked message of the session; INDIVIDUAL: this
        one; other modes: nothing (as JMS). Raises ConnectionLost if the message came
        over a connection that has since been lost (the broker redelivers it)."""
        if self.consumer is None:
            return
        self.consumer._acknowledge_message(self)

    def __repr__(self) -> str:
        return (f"Message(tag={self.delivery_tag}, rk={self.routing_key!r}, "
                f"redelivered={self.redelivered}, delivery_count={self.delivery_count}, "
                f"body={self.body[:40]!r})")


_ids = itertools.count(1)
_ID_PREFIX = f"ID:{os.uname().nodename}-{os.getpid()}-{os.urandom(3).hex()}"


def new_message_id(producer: str) -> str:
    """ActiveMQ-style message id: unique per process, cheap."""
    return f"{_ID_PREFIX}:{producer}:{next(_ids)}"


def message_id_prefix(producer: str) -> str:
    """What new_message_id puts before the counter, for a producer that builds ids in
    its hot path: `prefix + str(next_id())` equals new_message_id(producer)."""
    return f"{_ID_PREFIX}:{producer}:"


def next_id() -> int:
    return next(_ids)


DEDUP_HEADER = "x-deduplication-header"  # the broker's dedup id (docs/dedup.md)
_DEDUP_ENTRY = bytes((len(DEDUP_HEADER),)) + DEDUP_HEADER.encode() + b"S"


class OutboundMessage:
    """A message to publish; nacked or returned ones come back as these."""

    __slots__ = ("body", "exchange", "routing_key", "raw_properties", "message_id",
                 "mandatory")

    def __init__(self, body: bytes, exchange: str, routing_key: str, raw_properties: bytes,
                 message_id: str | None, mandatory: bool) -> None:
        self.body = body
        self.exchange = exchange
        self.routing_key = routing_key
        self.raw_properties = raw_properties
        self.message_id = message_id
        self.mandatory = mandatory

    @classmethod
    def build(cls, body: bytes | str, exchange: str, routing_key: str, mandatory: bool,
              message_id: str | None, *, headers: dict[str, Any] | None = None,
              persistent: bool = True, **props: Any) -> OutboundMessage:
        if isinstance(body, str):
            body = body.encode()
        raw = encode_basic_properties(headers=headers, delivery_mode=2 if persistent else 1,
                                      message_id=message_id, **props)
        return cls(body, exchange, routing_key, raw, message_id, mandatory)

    @classmethod
    def plain(cls, body: bytes, exchange: str, routing_key: str, mandatory: bool,
              message_id: str, persistent: bool, dedup: bool = False) -> OutboundMessage:
        """The common case (bytes body, a message id, delivery mode, nothing else) without
        the general property encoder: the same bytes as build() gives it. `dedup`: the
        id also goes in the `x-deduplication-header` header (idempotent producers)."""
        mid = message_id.encode()
        if len(mid) > 255:
            raise ValueError("property message_id longer than 255 bytes")
        mode = b"\x02" if persistent else b"\x01"
        if dedup:
            entry = _DEDUP_ENTRY + len(mid).to_bytes(4, "big") + mid
            raw = (b"\x30\x80" + len(entry).to_bytes(4, "big") + entry + mode
                   + bytes((len(mid),)) + mid)
        else:
            raw = b"\x10\x80" + mode + bytes((len(mid),)) + mid
        return cls(body, exchange, routing_key, raw, message_id, mandatory)

    @property
    def headers(self) -> dict[str, Any]:
        return dict(PropertiesView(self.raw_properties).headers or {})

    def __repr__(self) -> str:
        return (f"OutboundMessage(exchange={self.exchange!r}, rk={self.routing_key!r}, "
                f"id={self.message_id!r}, body={self.body[:40]!r})")


BatchItem = bytes | str | OutboundMessage | tuple[bytes | str, dict[str, Any] | None]
"""An item of send_batch: a body, a (body, headers) pair or an OutboundMessage."""
