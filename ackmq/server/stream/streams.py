"""Stream management commands (X1, X4, X5): Create/Delete (RabbitMQ's stream arguments
onto the stream queue's x- arguments, checked by the queue type as over AMQP), Metadata
(this broker as the leader of every stream, advertised at the address the client
reached), StreamStats, StoreOffset/QueryOffset (the stream's tracking, durable),
super streams (a direct exchange whose bindings, ordered by `x-stream-partition-order`,
name the partitions: Route, Partitions, CreateSuperStream, DeleteSuperStream) and
ResolveOffsetSpec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker import argument_table
from ackmq.broker.errors import ReplyError
from ackmq.broker.stream import TRACK_OFFSET
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream import frames as F
from ackmq.protocol.stream.frames import Command
from ackmq.server.stream.common import (
    PARTITION_ORDER,
    access_code,
    code_of,
    stream_queue,
    super_stream_partitions,
)
from ackmq.server.stream.subscriptions import committed_chunk_id, offset_spec

if TYPE_CHECKING:
    from ackmq.server.stream.connection import StreamConnection

LEADER = 0  # this broker's reference in Metadata
NO_LEADER = 0xFFFF


def _create_arguments() -> dict[str, str]:
    """RabbitMQ's Create arguments -> the stream queue's declare arguments: the stream
    type's keys of the argument table (broker/argument_table.py) without their `x-`."""
    return {n[2:]: n for n in argument_table.INDEX.type_args["stream"] if n != "x-queue-type"}


class _Refused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _arguments(given: dict[str, str | None]) -> dict[str, Any]:
    """The declare arguments of a Create: a whole number as a number (the frame carries
    strings), anything else as given; the stream type's checks then refuse a bad value
    (PRECONDITION_FAILED), as for any declare."""
    known = _create_arguments()
    args: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in given.items():
        name = known.get(key)
        if name is None or value is None:
            continue  # RabbitMQ 3.10 accepts unknown arguments
        try:
            args[name] = int(value)
        except ValueError:
            args[name] = value
    return args


def _declare(conn: StreamConnection, name: str | None, given: dict[str, str | None]) -> int:
    vh, ch = conn.vhost, conn.channel
    assert vh is not None and ch is not None
    if not name:
        return K.PRECONDITION_FAILED
    try:
        args = _arguments(given)
    except _Refused as e:
        return e.code
    q = vh.queues.get(name)
    if q is not None:
        # RabbitMQ: the same stream again is STREAM_ALREADY_EXISTS, with other arguments
        # (or another queue of that name) PRECONDITION_FAILED
        keys = set(_create_arguments().values()) | {"x-queue-type"}
        same = all(q.arguments.get(k) == args.get(k) for k in keys)
        return K.STREAM_ALREADY_EXISTS if same else K.PRECONDITION_FAILED
    try:
        ch.declare_queue(name, False, True, False, False, args)
    except ReplyError as e:
        return code_of(e)
    return K.OK


def create(conn: StreamConnection, c: Command) -> None:
    conn.write(F.response(K.CREATE, c.correlation_id, _declare(conn, c.stream, c.arguments)))


def _delete(conn: StreamConnection, name: str | None) -> int:
    q = stream_queue(conn, name)
    if q is None:
        return K.STREAM_DOES_NOT_EXIST
    vh, ch = conn.vhost, conn.channel
    assert vh is not None and ch is not None
    try:
        ch.delete_queue(q.name)
    except ReplyError as e:
        return code_of(e)
    return K.OK


def delete(conn: StreamConnection, c: Command) -> None:
    conn.write(F.response(K.DELETE, c.correlation_id, _delete(conn, c.stream)))


def metadata(conn: StreamConnection, c: Command) -> None:
    entries: list[tuple[str, int, int, list[int]]] = []
    for name in dict.fromkeys(c.streams):
        if stream_queue(conn, name) is not None:
            entries.append((name or "", K.OK, LEADER, []))
        else:
            entries.append((name or "", K.STREAM_DOES_NOT_EXIST, NO_LEADER, []))
    host, port = conn.advertised()
    brokers = [(LEADER, host, port)] if any(e[1] == K.OK for e in entries) else []
    conn.write(F.metadata_response(c.correlation_id, brokers, entries))


def stats(conn: StreamConnection, c: Command) -> None:
    """RabbitMQ 3.11+'s stream stats: the first offset and the newest chunk's (-1: none),
    the committed chunk id Deliver v2 sends too."""
    q = stream_queue(conn, c.stream)
    if q is None or q.log is None:
        conn.write(F.stats_response(c.correlation_id, K.STREAM_DOES_NOT_EXIST, {}))
        return
    lg = q.log
    empty = lg.next_offset == lg.first_offset
    conn.write(F.stats_response(c.correlation_id, K.OK, {
        "first_chunk_id": -1 if empty else lg.first_offset,
        "committed_chunk_id": -1 if empty else committed_chunk_id(q)}))


def store_offset(conn: StreamConnection, c: Command) -> None:
    """No answer in any case (the protocol has none): a stream that is not there, an
    empty reference or a refused write is ignored, as RabbitMQ."""
    q = stream_queue(conn, c.stream)
    ref = c.reference or ""
    if q is None or not ref:
        return
    if access_code(conn, q, write=True) != K.OK:
        return
    q.track(TRACK_OFFSET, ref, c.offset)


def query_offset(conn: StreamConnection, c: Command) -> None:
    q = stream_queue(conn, c.stream)
    if q is None:
        conn.write(F.u64_response(K.QUERY_OFFSET, c.correlation_id,
                                  K.STREAM_DOES_NOT_EXIST, 0))
        return
    v = q.tracked(TRACK_OFFSET, c.reference or "")
    conn.write(F.u64_response(K.QUERY_OFFSET, c.correlation_id,
                              K.NO_OFFSET if v is None else K.OK, v or 0))


def resolve_offset_spec(conn: StreamConnection, c: Command) -> None:
    q = stream_queue(conn, c.stream)
    if q is None:
        conn.write(F.offset_spec_response(c.correlation_id, K.STREAM_DOES_NOT_EXIST, 0))
        return
    conn.write(F.offset_spec_response(c.correlation_id, K.OK, offset_spec(q, c.offset)))


# -- super streams (RabbitMQ 3.11+: the protocol document is the reference) ----------------
def _partitions(conn: StreamConnection, super_stream: str | None) -> list[tuple[str, str]]:
    """(partition, binding key) of a super stream, by partition order; refused if none."""
    parts = super_stream_partitions(conn, super_stream)
    if parts is None:
        raise _Refused(K.STREAM_DOES_NOT_EXIST)
    return parts


def partitions(conn: StreamConnection, c: Command) -> None:
    try:
        names = list(dict.fromkeys(n for n, _k in _partitions(conn, c.super_stream)))
    except _Refused as e:
        conn.write(F.strings_response(K.PARTITIONS, c.correlation_id, e.code, []))
        return
    conn.write(F.strings_response(K.PARTITIONS, c.correlation_id, K.OK, names))


def route(conn: StreamConnection, c: Command) -> None:
    try:
        names = [n for n, k in _partitions(conn, c.super_stream) if k == c.routing_key]
    except _Refused as e:
        conn.write(F.strings_response(K.ROUTE, c.correlation_id, e.code, []))
        return
    conn.write(F.strings_response(K.ROUTE, c.correlation_id, K.OK, names))


def create_super_stream(conn: StreamConnection, c: Command) -> None:
    vh, ch = conn.vhost, conn.channel
    assert vh is not None and ch is not None
    name, parts, keys = c.name, c.partitions, c.binding_keys
    code = K.OK
    if not name or not parts or len(parts) != len(keys) or None in parts or None in keys:
        code = K.PRECONDITION_FAILED
    elif name in vh.exchanges or any(p in vh.queues for p in parts):
        code = K.STREAM_ALREADY_EXISTS
    else:
        try:
            ch.declare_exchange(name, "direct", False, True, False, False,
                                {"x-super-stream": True})
            for i, (part, key) in enumerate(zip(parts, keys, strict=True)):
                code = _declare(conn, part, c.arguments)
                if code != K.OK:
                    break
                vh.bind(name, vh.queues[part], key, {PARTITION_ORDER: i})
        except ReplyError as e:
            code = code_of(e)
    conn.write(F.response(K.CREATE_SUPER_STREAM, c.correlation_id, code))


def delete_super_stream(conn: StreamConnection, c: Command) -> None:
    vh, ch = conn.vhost, conn.channel
    assert vh is not None and ch is not None
    try:
        parts = _partitions(conn, c.name)
        ch.delete_exchange(c.name)
        code = K.OK
        for part, _key in parts:
            _delete(conn, part)
    except _Refused as e:
        code = e.code
    except ReplyError as e:
        code = code_of(e)
    conn.write(F.response(K.DELETE_SUPER_STREAM, c.correlation_id, code))
