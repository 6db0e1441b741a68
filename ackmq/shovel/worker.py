"""One dynamic shovel at work: two AMQP 0-9-1 connections (ackmq.client's raw channels),
a consumer at the source and a publisher at the destination, on the broker's loop with
no task per message (deliveries and confirms are callbacks of the connections' reads).

ack-mode (RabbitMQ's):
- on-confirm: the destination channel is in confirm mode; a message is acked at the
  source only once the destination confirmed it, nacked (requeued) if the destination
  nacked it. A crash of either end loses nothing: what was not confirmed is still
  unacked at the source and is delivered again (V2; a duplicate where the destination
  had already stored it).
- on-publish: acked at the source once written to the destination's socket.
- no-ack: consumed with auto-ack.

src-delete-after: `queue-length` (the source queue's depth when the shovel started) or
N messages, then the shovel deletes itself (on-confirm: once they are confirmed).
A lost connection (either end) closes both and reconnects after `reconnect-delay`,
doubling the wait after each failed attempt up to a minute; `reconnect-delay` 0 means
no reconnect (the shovel terminates), as RabbitMQ's.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from pamqp import commands as C

from ackmq.client.errors import ChannelClosed, ClientError, ConnectionLost
from ackmq.client.lowlevel import RawConnection, open_connection
from ackmq.client.tls import TLS_KEYS
from ackmq.protocol.amqp import (
    Content,
    decode_properties,
    encode_properties,
    properties_with_headers,
)
from ackmq.protocol.amqp.properties import header_value
from ackmq.protocol.amqp.property_names import to_pamqp
from ackmq.shovel.amqp10 import Peer10, target_of
from ackmq.shovel.config import ShovelConfig, redact
from ackmq.shovel.ends import Dest091, Dest10, Source091, Source10

log = logging.getLogger("ackmq.shovel")
MAX_BACKOFF = 60.0  # seconds between reconnect attempts, at most
NOT_FOUND = 404


def connect_url(uri: str, local: Any, user: str) -> str:
    """Where `uri` connects: `amqp://` or `amqp:///vhost` (no host) is this broker, as
    the user who set the shovel (RabbitMQ's direct connection); any other is a network
    connection with the URI's credentials (guest/guest when none, as amqp_uri's). Of
    the query `heartbeat` and, for `amqps://`, the TLS keys (client/tls.py) are kept
    (RabbitMQ's other keys mean nothing here)."""
    p = urlsplit(uri)
    if not p.hostname:
        path = p.path[1:] if p.path.startswith("/") else p.path
        return str(local.amqp_url(user, unquote(path) if path else "/"))
    keep = ("heartbeat", *TLS_KEYS) if p.scheme == "amqps" else ("heartbeat",)
    query = urlencode([(k, v) for k, v in parse_qsl(p.query) if k in keep])
    return urlunsplit((p.scheme, p.netloc, p.path or "/", query, ""))


class Unusable(Exception):
    """The definition cannot work (e.g. publish properties that cannot be encoded): the
    shovel terminates with this reason instead of reconnecting."""


class _Listener:
    """The source channel's listener: deliveries to the worker, the end to a future."""

    def __init__(self, on_deliver: Callable[[Content], None], ended: asyncio.Future[Any]) -> None:
        self.deliver, self.ended = on_deliver, ended

    def on_deliver(self, content: Content) -> None:
        self.deliver(content)

    def on_cancel(self, consumer_tag: str) -> None:  # the source queue went away
        if not self.ended.done():
            self.ended.set_result(ConnectionLost("consumer cancelled by the source broker"))

    def on_failed(self, error: ClientError) -> None:
        if not self.ended.done():
            self.ended.set_result(error)


class Worker:
    """Runs one shovel until stopped or done. `on_done` is called once when
    src-delete-after is reached (the component then deletes the shovel)."""

    def __init__(self, cfg: ShovelConfig, local: Any, user: str,
                 on_done: Callable[[Worker], None]) -> None:
        self.cfg, self.local, self.user, self.on_done = cfg, local, user, on_done
        self.state = "starting"
        self.reason: str | None = None
        self.since = time.time()
        self.src_uri = self.dest_uri = ""
        self.moved = 0          # messages acked at the source (or published: no-ack)
        self.attempts = 0       # connections made (1 + reconnects)
        self.limit: int | None = None  # src-delete-after, fixed by the first session
        self._task: asyncio.Task[None] | None = None
        self._conns: list[RawConnection] = []
        self._peers: list[Peer10] = []

    # -- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - it is going
                pass
        await self._close()

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    async def _run(self) -> None:
        cfg = self.cfg
        if cfg.delete_after == "queue-length" and cfg.src.queue is None \
                and not cfg.src.amqp10:
            self._set("terminated", '"src-delete-after queue-length needs a src-queue"')
            return
        delay = cfg.reconnect_delay
        while True:
            try:
                finished = await self._session(self.attempts)
            except asyncio.CancelledError:
                raise
            except Unusable as e:
                await self._close()
                self._set("terminated", f'"{e}"')
                log.warning("shovel %r in vhost %r terminated: %s", cfg.name, cfg.vhost, e)
                return
            except Exception as e:  # noqa: BLE001 - any failure: reconnect
                failure: Exception | None = e
                finished = False
            else:
                failure = None
            await self._close()
            if finished:
                self._set("terminated", '"src-delete-after reached"')
                self.on_done(self)
                return
            was_running = self.state == "running"
            reason = failure if failure is not None else "connection lost"
            log.warning("shovel %r in vhost %r: %s", cfg.name, cfg.vhost, reason)
            if cfg.reconnect_delay <= 0:
                self._set("terminated", f'"{reason}"')
                return
            if was_running:
                delay = cfg.reconnect_delay  # it ran: start the back-off again
            self._set("starting")
            await asyncio.sleep(delay)
            delay = min(delay * 2, max(MAX_BACKOFF, cfg.reconnect_delay))

    async def _close(self) -> None:
        peers, self._peers = self._peers, []
        for p in peers:
            await p.close()
        conns, self._conns = self._conns, []
        for c in conns:
            try:
                if not c.is_open:
                    c.abort()
                    continue
                async with asyncio.timeout(5):  # (not wait_for: it may drop a cancel)
                    await c.close()
            except (ClientError, OSError, TimeoutError):
                c.abort()

    async def _connect(self, uris: list[str], attempt: int, what: str) -> RawConnection:
        uri = self._uri(uris, attempt, what)
        conn = await open_connection(connect_url(uri, self.local, self.user),
                                     connection_name=f"Shovel {self.cfg.name}",
                                     heartbeat=30, reconnect=False)
        self._conns.append(conn)
        return conn

    async def _ensure_queue(self, conn: RawConnection, name: str, args: dict[str, Any]) -> int:
        """The queue's depth; declared (durable, with the shovel's queue args) when it is
        not there, as RabbitMQ's shovel declares src-queue and dest-queue."""
        ch = await conn.channel()
        try:
            ok = await ch.call(C.Queue.Declare(queue=name, passive=True))
        except ChannelClosed as e:
            if e.code != NOT_FOUND:
                raise
            ch = await conn.channel()
            ok = await ch.call(C.Queue.Declare(queue=name, durable=True, arguments=args))
        await ch.close()
        return int(ok.message_count)

    # -- one connected session --------------------------------------------------------------
    def _uri(self, uris: list[str], attempt: int, what: str) -> str:
        uri = uris[attempt % len(uris)] if uris else ""
        if not uri:
            raise ConnectionLost(f"no {what} URI")
        if what == "source":
            self.src_uri = uri
        else:
            self.dest_uri = uri
        return uri

    def _peer(self, what: str, address: str, settled: bool, credit: int = 0) -> Peer10:
        """An AMQP 1.0 link (a receiver at the source, a sender at the destination), to
        open once its callbacks are set."""
        peer = Peer10("receiver" if what == "source" else "sender", address,
                      f"shovel-{self.cfg.name}", settled, credit)
        self._peers.append(peer)
        return peer

    async def _open_peer(self, peer: Peer10, uris: list[str], attempt: int,
                         what: str) -> None:
        uri = self._uri(uris, attempt, what)
        await peer.open(target_of(uri, self.local, self.user), 30.0)

    async def _session(self, attempt: int) -> bool:
        """Move messages until a connection fails (raises / returns False) or
        src-delete-after is reached (returns True)."""
        cfg = self.cfg
        self.attempts += 1
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[Any] = loop.create_future()
        confirm = cfg.ack_mode == "on-confirm"
        no_ack = cfg.ack_mode == "no-ack"
        src10 = dest10 = None
        src = dest = None
        if cfg.src.amqp10:
            if cfg.delete_after == "queue-length":
                raise Unusable("src-delete-after queue-length needs an AMQP 0-9-1 src-queue")
        else:
            src = await self._connect(cfg.src.uris, attempt, "source")
        if not cfg.dest.amqp10:
            dest = await self._connect(cfg.dest.uris, attempt, "destination")
        queue = cfg.src.queue
        depth = 0
        if src is not None and queue is not None:
            depth = await self._ensure_queue(src, queue, cfg.src.queue_args)
        if dest is not None and cfg.dest.queue is not None:
            await self._ensure_queue(dest, cfg.dest.queue, cfg.dest.queue_args)
        if self.limit is None and attempt == 0:
            if cfg.delete_after == "queue-length":
                self.limit = depth
            elif isinstance(cfg.delete_after, int):
                self.limit = cfg.delete_after
        limit = None if self.limit is None else max(0, self.limit - self.moved)
        if limit == 0:
            return True
        prefetch = cfg.prefetch if limit is None else max(1, min(cfg.prefetch, limit))
        destination: Dest091 | Dest10
        if dest is not None:
            dest_ch = await dest.channel()
            if confirm:
                await dest_ch.confirm_select()
            dest_ch.chan.listener = _Listener(lambda c: None, ended)
            destination = Dest091(dest, dest_ch)
        else:
            dest10 = self._peer("destination", cfg.dest.address or "", not confirm)
            await self._open_peer(dest10, cfg.dest.uris, attempt, "destination")
            destination = Dest10(dest10, cfg.dest_properties, cfg.dest_application_properties,
                                 cfg.dest_message_annotations)
            try:
                destination.message("", "", b"\x00\x00", b"")
            except (ValueError, TypeError, AttributeError, OverflowError, struct.error) as e:
                raise Unusable(f"dest-properties cannot be encoded: {e}") from None
        source: Source091 | Source10 | None = None  # 1.0: attached after the mover
        if src is not None:
            src_ch = await src.channel()
            if queue is None:  # an exchange: a queue of our own bound to it
                ok = await src_ch.call(C.Queue.Declare(queue="", exclusive=True,
                                                       auto_delete=True))
                queue = ok.queue
                await src_ch.call(C.Queue.Bind(queue=queue, exchange=cfg.src.exchange or "",
                                               routing_key=cfg.src.exchange_key
                                               if cfg.src.exchange_key is not None else "#"))
            if not no_ack:
                await src_ch.qos(prefetch)
            source = Source091(src, src_ch)
        move = _Move(self, source, destination, confirm, no_ack, limit, ended)
        if move.edit:
            try:
                move.edit_properties(b"\x00\x00")
            except (ValueError, TypeError, OverflowError, struct.error) as e:
                raise Unusable(f"dest-publish-properties cannot be encoded: {e}") from None
        if dest10 is not None:
            if cfg.forward_headers:
                destination.extra = move.forward_properties  # type: ignore[union-attr]
            destination.timestamp = cfg.timestamp_header  # type: ignore[union-attr]
            dest10.ended.add_done_callback(lambda f: _end(ended, f.result()))
        destination.on_confirm(move.confirmed)
        if src is not None:
            deliver = move.deliver
            src_ch.chan.listener = _Listener(lambda c: deliver(
                c.method.delivery_tag, c.method.exchange, c.method.routing_key,
                c.properties, c.body), ended)
            await src_ch.call(C.Basic.Consume(queue=queue or "", no_ack=no_ack,
                                              arguments=cfg.consumer_args or None))
        else:
            src10 = self._peer("source", cfg.src.address or "", no_ack, prefetch)
            source = move.source = Source10(src10)
            source.deliver = move.deliver  # before the link opens: transfers follow it
            src10.ended.add_done_callback(lambda f: _end(ended, f.result()))
            await self._open_peer(src10, cfg.src.uris, attempt, "source")
        self._set("running")
        result = await ended
        if result is True:
            return True
        raise result if isinstance(result, BaseException) else ConnectionLost(str(result))


def _end(ended: asyncio.Future[Any], why: Any) -> None:
    if not ended.done():
        ended.set_result(why)


class _Move:
    """The per-message path of one session: called from the connections' reads."""

    def __init__(self, worker: Worker, source: Source091 | Source10 | None,
                 dest: Dest091 | Dest10, confirm: bool, no_ack: bool, limit: int | None,
                 ended: asyncio.Future[Any]) -> None:
        self.w, self.dest = worker, dest
        self.source: Source091 | Source10 | None = source
        self.confirm, self.no_ack, self.limit, self.ended = confirm, no_ack, limit, ended
        self.published = 0
        self.done = 0  # settled at the source this session
        self.seq = 0
        self.pending: OrderedDict[int, int] = OrderedDict()  # dest seq -> source tag
        cfg = worker.cfg
        self.exchange, self.key = cfg.dest.exchange, cfg.dest.exchange_key
        if cfg.dest.queue is not None:
            self.exchange, self.key = "", cfg.dest.queue
        self.back = cfg.back_to_death_queue
        self.edit = not cfg.dest.amqp10 and (cfg.forward_headers or cfg.timestamp_header
                                             or bool(cfg.publish_properties))

    def edit_properties(self, raw: bytes) -> bytes:
        cfg = self.w.cfg
        if cfg.publish_properties:
            p = decode_properties(raw)
            for k, v in to_pamqp(dict(cfg.publish_properties)).items():
                if k == "timestamp" and isinstance(v, int | float):
                    v = datetime.datetime.fromtimestamp(v, datetime.UTC)
                elif k in ("delivery_mode", "priority") and isinstance(v, float):
                    v = int(v)
                setattr(p, k, v)
            raw = encode_properties(p)
        extra: dict[str, Any] = {}
        if cfg.forward_headers:
            extra["x-shovelled"] = [self._forward_entry()]
        if cfg.timestamp_header:
            extra["x-shovelled-timestamp"] = int(time.time())
        return properties_with_headers(raw, extra) if extra else raw

    def forward_properties(self) -> dict[str, Any]:
        """An AMQP 1.0 destination's forward application properties, as RabbitMQ
        3.10's amqp10 shovel sets them (checked there: these three keys)."""
        cfg, w = self.w.cfg, self.w
        return {"shovel-name": cfg.name, "shovel-type": "dynamic",
                "shovelled-by": w.local.node}

    def _forward_entry(self) -> dict[str, Any]:
        """RabbitMQ's x-shovelled table, its keys in its order."""
        cfg, w = self.w.cfg, self.w
        entry: dict[str, Any] = {"shovelled-by": w.local.node, "shovel-type": "dynamic",
                                 "shovel-name": cfg.name, "shovel-vhost": cfg.vhost,
                                 "src-uri": redact(w.src_uri), "dest-uri": redact(w.dest_uri)}
        for key, v in (("src-exchange", cfg.src.exchange),
                       ("src-exchange-key", cfg.src.exchange_key),
                       ("src-queue", cfg.src.queue), ("src-address", cfg.src.address),
                       ("dest-exchange", cfg.dest.exchange),
                       ("dest-exchange-key", cfg.dest.exchange_key),
                       ("dest-queue", cfg.dest.queue)):
            if v is not None:
                entry[key] = v
        return entry

    def deliver(self, tag: int, exchange: str, key: str, props: bytes, body: bytes) -> None:
        if self.limit is not None and self.published >= self.limit:
            return  # past src-delete-after: left unacked, requeued when we close
        if self.exchange is not None:
            exchange = self.exchange
        if self.key is not None:
            key = self.key
        if self.back:
            home = header_value(props, "x-first-death-queue")
            if isinstance(home, bytes | str) and home:
                exchange = ""
                key = home.decode("utf-8", "replace") if isinstance(home, bytes) else home
        if self.edit:
            props = self.edit_properties(props)
        self.dest.publish(exchange, key, props, body)
        self.published += 1
        if self.confirm:
            self.seq += 1
            self.pending[self.seq] = tag
        else:
            if not self.no_ack and self.source is not None:
                self.source.ack([tag])
            self.w.moved += 1
            self.done += 1
            self._check_done()

    def confirmed(self, tag: int, multiple: bool, ack: bool, first: int = 0) -> None:
        """`first`: an AMQP 1.0 disposition's range first..tag, settled at the source
        together (one disposition per run there, not one per message)."""
        pending = self.pending
        tags: list[int] = []
        if first:
            for seq in range(first, tag + 1):
                src_tag = pending.pop(seq, None)
                if src_tag is not None:
                    tags.append(src_tag)
        elif multiple:
            while pending:
                seq = next(iter(pending))
                if seq > tag:
                    break
                tags.append(pending.pop(seq))
        else:
            src_tag = pending.pop(tag, None)
            if src_tag is not None:
                tags.append(src_tag)
        if not tags or self.source is None:
            return
        try:
            if ack:
                self.source.ack(tags)
                self.w.moved += len(tags)
                self.done += len(tags)
            else:
                self.source.nack(tags)
                self.published -= len(tags)
        except ClientError as e:
            if not self.ended.done():
                self.ended.set_result(e)
            return
        self._check_done()

    def _check_done(self) -> None:
        if self.limit is not None and self.done >= self.limit and not self.pending \
                and not self.ended.done():
            self.ended.set_result(True)
