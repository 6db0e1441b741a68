"""A minimal asyncio client of RabbitMQ's stream protocol for the bench's stream workloads
(stream_load.py): open (PLAIN), create/delete a stream, a publisher whose confirms are
counted, a subscription whose chunks are counted and credited back one at a time (as
rstream and the Java client do). Frames by hand from PROTOCOL.adoc's layouts; the
keys are protocol/stream's."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from ackmq.protocol.stream import constants as K
from ackmq.protocol.wire import I32 as _I32
from ackmq.protocol.wire import U16 as _U16
from ackmq.protocol.wire import U32 as _U32

_HDR = struct.Struct(">IHH")
_ENTRY = struct.Struct(">QI")
_CHUNK_RECORDS = struct.Struct(">I")  # at 4 in a chunk's header: its number of records


class StreamWireError(Exception):
    pass


def _str(s: str) -> bytes:
    b = s.encode()
    return _U16.pack(len(b)) + b


def _map(d: dict[str, str]) -> bytes:
    return _I32.pack(len(d)) + b"".join(_str(k) + _str(v) for k, v in d.items())


def _frame(key: int, body: bytes, version: int = 1) -> bytes:
    return _HDR.pack(len(body) + 4, key, version) + body


class StreamConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._corr = 0
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._tune: asyncio.Future[tuple[int, int]] = \
            asyncio.get_running_loop().create_future()
        self.on_confirm: Callable[[int], None] = lambda n: None  # publishing ids confirmed
        self.on_chunk: Callable[[int, int], None] = lambda sub, n: None  # records delivered
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> StreamConnection:
        """`rabbitmq-stream://user:pass@host:port/vhost`."""
        u = urlsplit(url)
        reader, writer = await asyncio.open_connection(u.hostname or "127.0.0.1",
                                                       u.port or 5552)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # uvloop leaves Nagle on: small Credit frames would wait
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = cls(reader, writer)
        await c._call(K.PEER_PROPERTIES, _map({"product": "ackmq-bench"}))
        await c._call(K.SASL_HANDSHAKE, b"")
        cred = f"\0{unquote(u.username or 'guest')}\0{unquote(u.password or 'guest')}" \
            .encode()
        await c._call(K.SASL_AUTHENTICATE, _str("PLAIN") + _I32.pack(len(cred)) + cred)
        frame_max, heartbeat = await c._tune
        c.writer.write(_frame(K.RESPONSE | K.TUNE, _U32.pack(frame_max) + _U32.pack(0)))
        vhost = unquote((u.path or "/")[1:]) or "/"
        await c._call(K.OPEN, _str(vhost))
        return c

    async def _call(self, key: int, body: bytes, ok: tuple[int, ...] = (K.OK,)) -> int:
        self._corr += 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting[self._corr] = fut
        self.writer.write(_frame(key, _U32.pack(self._corr) + body))
        code = await fut
        if code not in ok:
            raise StreamWireError(f"command 0x{key:04x} answered 0x{code:02x}")
        return code

    async def _read(self) -> None:
        r = self.reader
        try:
            while True:
                (n,) = _U32.unpack(await r.readexactly(4))
                data = await r.readexactly(n)
                key = _U16.unpack_from(data, 0)[0]
                if key == K.DELIVER:
                    sub = data[4]
                    self.on_chunk(sub, _CHUNK_RECORDS.unpack_from(data, 5 + 4)[0])
                elif key == K.PUBLISH_CONFIRM:
                    self.on_confirm(_I32.unpack_from(data, 5)[0])
                elif key == K.PUBLISH_ERROR:
                    raise StreamWireError("PublishError from the broker")
                elif key == K.TUNE:
                    self._tune.set_result((_U32.unpack_from(data, 4)[0],
                                           _U32.unpack_from(data, 8)[0]))
                elif key & K.RESPONSE:
                    corr = _U32.unpack_from(data, 4)[0]
                    fut = self._waiting.pop(corr, None)
                    if fut is not None and not fut.done():
                        fut.set_result(_U16.unpack_from(data, 8)[0])
                elif key == K.CLOSE:
                    raise StreamWireError("the broker closed the connection")
        except (asyncio.IncompleteReadError, ConnectionError, StreamWireError) as e:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(StreamWireError(str(e)))

    async def create(self, stream: str) -> None:
        await self._call(K.CREATE, _str(stream) + _map({}), (K.OK, K.STREAM_ALREADY_EXISTS))

    async def delete(self, stream: str) -> None:
        await self._call(K.DELETE, _str(stream), (K.OK, K.STREAM_DOES_NOT_EXIST))

    async def declare_publisher(self, publisher_id: int, stream: str) -> None:
        await self._call(K.DECLARE_PUBLISHER, bytes((publisher_id,)) + _str("") + _str(stream))

    def publish(self, publisher_id: int, first_id: int, messages: list[bytes]) -> None:
        """One Publish frame of `messages`, publishing ids first_id, first_id + 1, ..."""
        parts: list[Any] = [bytes((publisher_id,)), _I32.pack(len(messages))]
        for i, m in enumerate(messages):
            parts += (_ENTRY.pack(first_id + i, len(m)), m)
        body = b"".join(parts)
        self.writer.write(_HDR.pack(len(body) + 4, K.PUBLISH, 1) + body)

    async def subscribe(self, subscription_id: int, stream: str, credit: int) -> None:
        """From `first`."""
        await self._call(K.SUBSCRIBE, bytes((subscription_id,)) + _str(stream)
                         + _U16.pack(K.OFFSET_FIRST) + _U16.pack(credit) + _map({}))

    def credit(self, subscription_id: int, credit: int = 1) -> None:
        self.writer.write(_frame(K.CREDIT, bytes((subscription_id,)) + _U16.pack(credit)))

    async def drain(self) -> None:
        await self.writer.drain()

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._call(K.CLOSE, _U16.pack(K.OK) + _str("bye")), 5)
        except (StreamWireError, TimeoutError, ConnectionError):
            pass
        self._task.cancel()
        self.writer.close()
