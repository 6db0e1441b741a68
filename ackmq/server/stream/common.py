"""What the stream front end's modules share: the stream a command names, and the model's
refusals in the protocol's response codes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ackmq.broker.errors import ReplyError
from ackmq.broker.stream import StreamQueue
from ackmq.protocol.stream import constants as K

if TYPE_CHECKING:
    from ackmq.server.stream.connection import StreamConnection

PARTITION_ORDER = "x-stream-partition-order"
ACCESS_REFUSED_CODE = 403
NOT_FOUND_CODE = 404


def stream_queue(conn: StreamConnection, name: str | None) -> StreamQueue | None:
    """The stream queue of that name in the connection's vhost (None: no such stream, or
    a queue of another type, as RabbitMQ's stream plugin sees it)."""
    vh = conn.vhost
    if vh is None or name is None:
        return None
    q = vh.queues.get(name)
    return q if isinstance(q, StreamQueue) and not q.deleted else None


def code_of(e: ReplyError) -> int:
    """A model refusal as the protocol's response code."""
    if e.code == ACCESS_REFUSED_CODE:
        return K.ACCESS_REFUSED
    if e.code == NOT_FOUND_CODE:
        return K.STREAM_DOES_NOT_EXIST
    return K.PRECONDITION_FAILED


def access_code(conn: StreamConnection, q: StreamQueue, write: bool) -> int:
    """K.OK when the connection's user may write (a publisher, a stored offset) or read
    (a subscription) the stream, else the refusal as a response code."""
    ch = conn.channel
    try:
        if ch is not None:
            (ch.check_stream_writer if write else ch.check_stream_reader)(q.name)
    except ReplyError as e:
        return code_of(e)
    return K.OK


def super_stream_partitions(conn: StreamConnection, super_stream: str | None
                            ) -> list[tuple[str, str]] | None:
    """(partition, binding key) of a super stream, by partition order (the bindings'
    `x-stream-partition-order`); None when there is no such exchange."""
    vh = conn.vhost
    x = vh.exchanges.get(super_stream or "") if vh is not None and super_stream else None
    if x is None:
        return None
    bound = []
    for b in x.bindings.values():
        q = b.destination
        if getattr(q, "kind", "") == "stream" and not q.deleted:
            order = b.arguments.get(PARTITION_ORDER, 0)
            bound.append((order if isinstance(order, int) else 0, q.name, b.routing_key))
    return [(name, key) for _o, name, key in sorted(bound)]
