"""Reading a stream's offset range over RabbitMQ's stream protocol (port 5552), for the
Spark source's read tasks (R4, X2): `option("protocol", "stream")`.

One blocking socket per read task (a Python worker runs one task at a time: no event
loop needed): PeerProperties, SASL PLAIN, Tune (no heartbeats: a task is short), Open,
then Subscribe at offset `start` with a few chunks of credit, one more credit per chunk
received while the range may still hold messages. A Deliver carries a whole osiris chunk
(`protocol.stream.chunk.read_chunk`: the i-th record is offset first + i); the chunk
holding `start` may begin before it, so records before `start` are skipped, and the read
ends at the first offset >= end - 1, as the AMQP reader's (streamwire.py) does. Each
record is an AMQP 1.0 message (RabbitMQ's stream format); it becomes the same columns as
an AMQP 0-9-1 delivery through RabbitMQ's 1.0 -> 0-9-1 mapping (protocol/amqp10), the
exchange and routing key taken from the message annotations x-exchange / x-routing-key.
Messages of one publisher mostly share everything before the body: their columns are
computed once per distinct prefix.

An `amqps://` url reads over the stream protocol's TLS listener (`rabbitmq-stream+tls://`,
5551 by default, RabbitMQ's stream.listeners.ssl) with the url's TLS options (CA, client
certificate and key, verify, server name: ackmq.client.tls, one place for both readers).
The login is SASL PLAIN with the url's user, as the AMQP reader's (ackmq.client logs in
with PLAIN only): never EXTERNAL, even with a client certificate.

The probes (first and last offset, the data-loss check) stay on AMQP (streamwire):
they run in the driver, a few per batch, and RabbitMQ 3.10 has no StreamStats.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ackmq.client.tls import TLS_KEYS, TlsOptions, tls_options
from ackmq.protocol.amqp10 import DecodeError, decode_message
from ackmq.protocol.amqp10.amqp_map import to_amqp091
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream.chunk import read_chunk
from ackmq.protocol.stream.frames import StreamFrameError, frame
from ackmq.protocol.stream.messages import RAW_HEADER, split_data
from ackmq.protocol.stream.peer import (
    ServerFrame,
    close_response,
    metadata_codes,
    read_frame,
    read_properties,
    request,
)
from ackmq.spark.amqp import ConsumerError, safe_url
from ackmq.spark.schema import PROPERTY_FIELDS, properties_columns
from ackmq.spark.streamwire import Delivered, data_loss, report_loss

SCHEME, TLS_SCHEME = "rabbitmq-stream", "rabbitmq-stream+tls"
DEFAULT_PORT = 5552
DEFAULT_TLS_PORT = 5551  # RabbitMQ's stream.listeners.ssl
#: chunks asked for at Subscribe; one more per chunk received while the range goes on
INITIAL_CREDIT = 8
_SIZE = struct.Struct(">I")
_CODE_NAMES = {getattr(K, n): n for n in (
    "OK", "STREAM_DOES_NOT_EXIST", "SUBSCRIPTION_ID_ALREADY_EXISTS",
    "SUBSCRIPTION_ID_DOES_NOT_EXIST", "STREAM_ALREADY_EXISTS", "STREAM_NOT_AVAILABLE",
    "SASL_MECHANISM_NOT_SUPPORTED", "AUTHENTICATION_FAILURE", "SASL_ERROR",
    "SASL_CHALLENGE", "SASL_AUTHENTICATION_FAILURE_LOOPBACK",
    "VIRTUAL_HOST_ACCESS_FAILURE", "UNKNOWN_FRAME", "FRAME_TOO_LARGE", "INTERNAL_ERROR",
    "ACCESS_REFUSED", "PRECONDITION_FAILED", "PUBLISHER_DOES_NOT_EXIST", "NO_OFFSET")}


def code_name(code: int) -> str:
    return f"0x{code:02x} {_CODE_NAMES.get(code, 'UNKNOWN')}"


def stream_url_for(url: str, port: int | None = None) -> str:
    """The stream protocol's URL for an AMQP URL: same user, password, host and vhost,
    port `port` (5552 by default); an `amqps://` URL gives the stream protocol over TLS
    (`rabbitmq-stream+tls://`, 5551 by default) with the same TLS options (CA, client
    certificate, server name, verify). A stream URL is kept as it is."""
    u = urlsplit(url)
    if u.scheme in (SCHEME, TLS_SCHEME):
        return url
    tls = u.scheme == "amqps"
    login, at, _ = u.netloc.rpartition("@")
    host = u.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    query = _tls_query(u.query) if tls else ""
    return urlunsplit((TLS_SCHEME if tls else SCHEME,
                       f"{login}{at}{host}:{port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT)}",
                       u.path or "/", query, ""))


def _tls_query(query: str) -> str:
    """The TLS keys of a URL's query (its other options are the AMQP client's)."""
    return urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
                      if k in TLS_KEYS], safe="/:")


def tls_of(url: str) -> TlsOptions | None:
    """The TLS options of a stream URL (None: plain `rabbitmq-stream://`): the query keys
    of an `amqps://` URL (ackmq.client.tls). A wrong scheme or key is a ValueError."""
    u = urlsplit(url)
    query = parse_qsl(u.query, keep_blank_values=True)
    unknown = sorted({k for k, _ in query if k not in TLS_KEYS})
    if unknown:
        raise ValueError(f"unknown stream URL option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(TLS_KEYS)}")
    if u.scheme == TLS_SCHEME:
        return tls_options(query)
    if u.scheme != SCHEME:
        raise ValueError(f"a stream URL is {SCHEME}:// or {TLS_SCHEME}://, got {url!r}")
    if query:
        raise ValueError(f"the TLS options ({', '.join(TLS_KEYS)}) need a {TLS_SCHEME}:// "
                         "URL")
    return None


def with_tls_of(stream_url: str, amqp_url: str) -> str:
    """A `rabbitmq-stream+tls://` URL without TLS options takes those of the `amqps://`
    URL (the same CA and client certificate for both listeners)."""
    s, a = urlsplit(stream_url), urlsplit(amqp_url)
    if s.scheme != TLS_SCHEME or s.query or a.scheme != "amqps":
        return stream_url
    query = _tls_query(a.query)
    return urlunsplit(s._replace(query=query)) if query else stream_url


_BASIC = "x-basic-"
_PROPERTY_INDEX = {n: i for i, (n, _) in enumerate(PROPERTY_FIELDS)}
_INT_PROPERTY = [kind == "int" for _, kind in PROPERTY_FIELDS]


class Route(NamedTuple):
    """What stream_batch reads of a delivery's method."""

    exchange: str
    routing_key: str


class _Columns:
    """A stream-format message -> (route, property columns, headers, body), cached by
    the bytes before the body."""

    def __init__(self) -> None:
        self.cache: dict[bytes, tuple[Route, tuple[Any, ...], dict[str, Any]]] = {}

    def __call__(self, data: bytes) -> tuple[Route, tuple[Any, ...], dict[str, Any], bytes]:
        split = split_data(data)
        if split is not None:
            hit = self.cache.get(split[0])
            if hit is not None:
                route, props, headers = hit
                return route, props, dict(headers), split[1]
        try:
            m = decode_message(data)
        except (DecodeError, ValueError, TypeError, IndexError):
            # not an AMQP 1.0 message (a stream client may append any bytes)
            return Route("", ""), properties_columns(b"\x00\x00")[0], \
                {RAW_HEADER: True}, bytes(data)
        ann = m.message_annotations or {}
        exchange = ann.pop("x-exchange", "")
        routing_key = ann.pop("x-routing-key", "")
        # RabbitMQ 3.10 keeps the 0-9-1 properties 1.0 has no place for as x-basic-*
        # annotations (delivery mode, priority, expiration) and application properties
        # (type, app id)
        basic: dict[Any, Any] = {}
        for section in (ann, m.application_properties or {}):
            for k in [k for k in section if str(k).startswith(_BASIC)]:
                basic[k] = section.pop(k)
        raw, body = to_amqp091(m)
        props, found = properties_columns(raw)
        headers = found or {}
        if basic:
            cols = list(props)
            for k, v in basic.items():
                i = _PROPERTY_INDEX.get(str(k)[len(_BASIC):].replace("-", "_"))
                if i is not None and v is not None:
                    with contextlib.suppress(ValueError, TypeError):
                        cols[i] = int(v) if _INT_PROPERTY[i] else str(v)
            props = tuple(cols)
        route = Route(str(exchange or ""), str(routing_key or ""))
        if split is not None and m.data is not None and m.data == split[1] \
                and m.footer is None and m.delivery_annotations is None:
            if len(self.cache) >= 4096:
                self.cache.clear()
            self.cache[split[0]] = (route, props, dict(headers))
        return route, props, headers, body


class StreamPeer:
    """A blocking stream-protocol connection (one read task's)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        u = urlsplit(url)
        tls = tls_of(url)
        host = u.hostname or "127.0.0.1"
        ctx: ssl.SSLContext | None = None
        if tls is not None:
            try:
                ctx = tls.context()  # reads the files now
            except OSError as exc:
                raise ConsumerError(f"{self.what()}: the TLS options: {exc}") from exc
        try:
            raw = socket.create_connection(
                (host, u.port or (DEFAULT_PORT if tls is None else DEFAULT_TLS_PORT)),
                timeout=timeout)
        except OSError as exc:
            listener = "RabbitMQ's rabbitmq_stream plugin" if tls is None else \
                "its TLS listener: RabbitMQ's stream.listeners.ssl, ackmq's --stream-tls-port"
            raise ConsumerError(
                f"cannot reach the {self.what()}: {exc!r} (is the stream protocol enabled "
                f"there, {listener}? set the source option streamUrl, or protocol=amqp)"
                ) from exc
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = raw
        if ctx is not None and tls is not None:
            try:  # the handshake: the certificate's chain and name, a client certificate
                self.sock = ctx.wrap_socket(raw, server_hostname=tls.server_hostname(host))
            except OSError as exc:
                raw.close()
                raise ConsumerError(f"{self.what()}: TLS handshake failed: {exc}") from exc
        self.buf = bytearray()
        self.corr = 0
        self.pending: list[ServerFrame] = []  # frames read while waiting for a response
        self.timeout = timeout
        r = self.call(K.PEER_PROPERTIES, properties={"product": "ackmq-spark"})
        self.properties = read_properties(r.rest)
        self.call(K.SASL_HANDSHAKE)
        cred = b"\0" + unquote(u.username or "guest").encode() + b"\0" + \
            unquote(u.password or "guest").encode()
        r = self.call(K.SASL_AUTHENTICATE, ok=(), mechanism="PLAIN", data=cred)
        if r.code != K.OK:
            raise ConsumerError(f"{self.what()}: login refused ({code_name(r.code)})")
        tune = self._wait(lambda f: f.key == K.TUNE)
        self.send(frame(K.RESPONSE | K.TUNE, 1,
                        _SIZE.pack(tune.frame_max) + _SIZE.pack(0)))
        vhost = unquote((u.path or "/")[1:]) or "/"
        r = self.call(K.OPEN, ok=(), vhost=vhost)
        if r.code != K.OK:
            raise ConsumerError(f"{self.what()}: vhost {vhost!r} refused "
                                f"({code_name(r.code)})")

    def what(self) -> str:
        return f"stream protocol at {safe_url(self.url)}"

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next(self, timeout: float) -> ServerFrame | None:
        """The next frame, None if none came within `timeout`."""
        if self.pending:
            return self.pending.pop(0)
        buf = self.buf
        deadline = time.monotonic() + timeout
        while True:
            if len(buf) >= 4:
                n = _SIZE.unpack_from(buf, 0)[0]
                if len(buf) >= 4 + n:
                    data = bytes(buf[4:4 + n])
                    del buf[:4 + n]
                    return read_frame(data)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                got = self.sock.recv(1 << 18)
            except TimeoutError:
                return None
            if not got:
                raise ConsumerError(f"{self.what()}: the broker closed the connection")
            buf += got

    def _wait(self, match: Any) -> ServerFrame:
        deadline = time.monotonic() + self.timeout
        held: list[ServerFrame] = []
        try:
            while True:
                f = self.next(max(0.0, deadline - time.monotonic()))
                if f is None:
                    raise ConsumerError(f"{self.what()}: no answer in {self.timeout:.0f}s")
                if match(f):
                    return f
                if f.key == K.CLOSE:
                    self.closed_by_server(f)
                held.append(f)
        finally:
            self.pending[:0] = held

    def closed_by_server(self, f: ServerFrame) -> None:
        with contextlib.suppress(OSError):
            self.send(close_response(f.correlation_id))
        raise ConsumerError(f"{self.what()}: the broker closed the connection: "
                            f"{code_name(f.code)} {f.reason or ''}".rstrip())

    def call(self, key: int, ok: tuple[int, ...] = (K.OK,), **fields: Any) -> ServerFrame:
        """A request and its response (a code not in `ok` raises; `ok=()`: any)."""
        self.corr += 1
        corr = self.corr
        self.send(request(key, correlation_id=corr, **fields))
        r = self._wait(lambda f: f.key == K.RESPONSE | key and f.correlation_id == corr)
        if ok and r.code not in ok:
            raise ConsumerError(f"{self.what()}: command 0x{key:04x} answered "
                                f"{code_name(r.code)}")
        return r

    def close(self) -> None:
        """Close as the protocol says (a log line less on RabbitMQ), then the socket."""
        try:
            self.corr += 1
            self.send(request(K.CLOSE, correlation_id=self.corr, code=K.OK, reason="done"))
            self.timeout = 2.0
            self._wait(lambda f: f.key == K.RESPONSE | K.CLOSE)
        except (OSError, ConsumerError, StreamFrameError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()


def unusable(url: str, stream: str, product: str) -> str | None:
    """Why the stream protocol at `url` cannot stand in for the AMQP broker whose
    `product` is given, to read `stream` (None: it can): nothing listens, the login or
    vhost is refused, another broker answers, or it has no such stream."""
    try:
        peer = StreamPeer(url, timeout=5.0)
    except (ConsumerError, StreamFrameError) as exc:
        return str(exc)
    try:
        theirs = peer.properties.get("product", "")
        if theirs != product:
            return (f"{peer.what()} is {theirs!r}, the AMQP broker {product!r} (set the "
                    "source option streamUrl)")
        r = peer.call(K.METADATA, streams=[stream])
        code = metadata_codes(r.rest).get(stream, K.STREAM_DOES_NOT_EXIST)
        if code != K.OK:
            return f"{peer.what()}: stream {stream!r}: {code_name(code)}"
        return None
    except (ConsumerError, StreamFrameError) as exc:
        return str(exc)
    finally:
        peer.close()


def read_range(url: str, stream: str, start: int, end: int, *, amqp_url: str,
               rows: int = 4096, stall: float = 60.0, credit: int = INITIAL_CREDIT,
               fail_on_data_loss: bool = True) -> Iterator[list[Delivered]]:
    """Messages with start <= offset < end over the stream protocol at `url`, in offset
    order, `rows` at a time: what streamwire.read_range gives over AMQP (the same
    Delivered items, `method` a Route). The data-loss check probes over `amqp_url`."""
    if end <= start:
        return
    peer = StreamPeer(url)
    try:
        sub = 1
        r = peer.call(K.SUBSCRIBE, ok=(), subscription_id=sub, stream=stream,
                      offset=(K.OFFSET_OFFSET, start), credit=credit, properties={})
        if r.code != K.OK:
            hint = " (declare it as x-queue-type=stream)" \
                if r.code == K.STREAM_DOES_NOT_EXIST else ""
            raise ConsumerError(f"cannot read stream {stream!r} at {safe_url(url)}: "
                                f"Subscribe answered {code_name(r.code)}{hint}")
        columns = _Columns()
        items: list[Delivered] = []
        checked, seen = False, 0
        last_at = time.monotonic()
        credit_frame = request(K.CREDIT, subscription_id=sub, credit=1)
        while True:
            f = peer.next(1.0)
            if f is None:
                if time.monotonic() - last_at > stall:
                    raise ConsumerError(
                        f"cannot read stream {stream!r} at {safe_url(url)}: no chunk for "
                        f"{stall:.0f}s while reading offsets [{start}, {end}) ({seen} "
                        "received; stream deleted, or truncated by retention past the "
                        "range?)")
                continue
            key = f.key
            if key == K.DELIVER:
                last_at = time.monotonic()
                try:
                    first, _ts, msgs = read_chunk(f.chunk)
                except (StreamFrameError, struct.error, IndexError) as e:
                    raise ConsumerError(f"{peer.what()}: a bad chunk: {e}") from None
                last = first + len(msgs) - 1
                done = last >= end - 1
                if not done:
                    peer.send(credit_frame)
                if not checked and msgs and last >= start:
                    checked = True
                    if first > start:
                        loss = data_loss(amqp_url, stream, start, end, first)
                        if loss is not None:
                            report_loss(loss, fail_on_data_loss)
                lo = max(0, start - first)
                hi = min(len(msgs), end - first)
                for i in range(lo, hi):
                    route, props, headers, body = columns(msgs[i])
                    items.append(Delivered(first + i, route, props, headers, body))
                seen += len(msgs)
                if done:
                    if items:
                        yield items
                    return
                if len(items) >= rows:
                    yield items
                    items = []
            elif key == K.CLOSE:
                peer.closed_by_server(f)
            elif key == K.METADATA_UPDATE:
                raise ConsumerError(f"cannot read stream {stream!r} at {safe_url(url)}: "
                                    f"it became unavailable ({code_name(f.code)}: deleted?)")
            elif key == K.RESPONSE | K.CREDIT:
                raise ConsumerError(f"{peer.what()}: Credit answered {code_name(f.code)}")
            elif key == K.HEARTBEAT:
                peer.send(frame(K.HEARTBEAT, 1, b""))
    finally:
        peer.close()
