"""What a delivery carries to a client, whatever the protocol: the message's properties
as published, byte for byte, plus only the headers its consumer or queue asked for.
AMQP encodes them into basic.deliver / basic.get-ok, STOMP into MESSAGE headers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ackmq.protocol.amqp.constants import DELIVERY_COUNT_HEADER, SEQ_HEADER
from ackmq.protocol.amqp.properties import properties_with_header, properties_with_headers

if TYPE_CHECKING:
    from ackmq.broker.queue_type import QueueEntry


def delivery_properties(entry: QueueEntry, seq_header: bool, count_header: bool) -> bytes:
    """The raw properties plus `x-ackmq-seq` (S2) when asked and, on a redelivery,
    `x-delivery-count` (D10) when asked. Clients compare and sign headers: nothing
    unasked is added."""
    message = entry.message
    assert message is not None  # only a purge's spilled entries come without one
    props = message.properties
    count = entry.delivery_count if count_header else 0
    if not seq_header:
        return properties_with_headers(props, {DELIVERY_COUNT_HEADER: count}) if count \
            else props
    if not count:
        return properties_with_header(props, SEQ_HEADER, entry.seq)
    return properties_with_headers(props, {SEQ_HEADER: entry.seq, DELIVERY_COUNT_HEADER: count})
