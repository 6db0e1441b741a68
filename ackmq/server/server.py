"""The composition root: builds the broker model, the store, the access model, the
resource alarms and the front-end context, and opens one listener per protocol and port
through one `_listen()`. Nothing protocol-specific lives here: a protocol is a connection
class taking a `FrontEnd` (docs/DESIGN.md, "Adding a protocol").

`request_flush()` schedules one callback for the end of the current loop turn
(server/turn.py): the broker's end-of-turn work, then every connection's buffered frames.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ackmq.broker import BrokerModel
from ackmq.broker.access import AccessError, AccessModel
from ackmq.broker.scheduled import Bounds
from ackmq.broker.storage import CorruptStore, StoreError
from ackmq.server.config import Config
from ackmq.server.context import FrontEnd, HttpContext
from ackmq.server.parameters import Parameters
from ackmq.server.timers import LoopTimers
from ackmq.server.transport import ClientConnection
from ackmq.server.turn import Turn

log = logging.getLogger("ackmq.server")

ADMIN_SOCKET = "ctl.sock"


def _unspecified(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_unspecified
    except ValueError:
        return False


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _amqp(ctx: FrontEnd) -> Any:
    from ackmq.server.amqp.connection import AMQPConnection
    if ctx.config.amqp10:  # A1: the protocol header picks 0-9-1 or 1.0 (server/sniff.py)
        from ackmq.server.sniff import Sniffer
        return Sniffer(ctx, AMQPConnection, _amqp10)
    return AMQPConnection(ctx)


def _amqp10(ctx: FrontEnd) -> ClientConnection:
    from ackmq.server.amqp10.connection import AMQP10Connection
    return AMQP10Connection(ctx)


def _stomp(ctx: FrontEnd) -> ClientConnection:
    from ackmq.server.stomp.connection import StompConnection
    return StompConnection(ctx)


def _stream(ctx: FrontEnd) -> ClientConnection:
    from ackmq.server.stream.connection import StreamConnection
    return StreamConnection(ctx)


def _mqtt(ctx: FrontEnd) -> ClientConnection:
    from ackmq.server.mqtt.connection import MQTTConnection
    return MQTTConnection(ctx)


@dataclass(eq=False)
class Listener:
    """One protocol on one port (plain or TLS), and where it ended up listening."""

    name: str  # in messages: "AMQP", "STOMP", "AMQPS", "STOMP over TLS"
    scheme: str  # of its URL: amqp, stomp, amqps, stomp+ssl
    port: int  # as asked; 0 picks a free one
    connection: Callable[[FrontEnd], Any]  # a ClientConnection (or the AMQP sniffer)
    tls: bool = False
    server: asyncio.Server | None = None
    bound_port: int = 0
    bound: list[str] = field(default_factory=list)  # host:port of each socket
    url: str = ""


class Server:
    """One broker process (or one embedded broker): the model plus its sockets."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.broker: BrokerModel = None  # type: ignore[assignment]
        self.ctx: FrontEnd = None  # type: ignore[assignment]  # set by start()
        self.turn: Turn = None  # type: ignore[assignment]  # set by start()
        self._timers: LoopTimers | None = None  # the broker's timers on the loop (C5)
        self.listeners: list[Listener] = []
        self.url = ""  # for a client on this machine (loopback when bound to all interfaces)
        self.port = 0
        self.bound: list[str] = []  # host:port of each AMQP listening socket
        self.all_interfaces = False  # bound to 0.0.0.0 and/or ::
        self.tls_url = ""  # amqps://host:port/, "" without a TLS listener
        self.tls_port = 0
        self.stomp_url = ""  # stomp://host:port, "" without a STOMP listener
        self.stomp_port = 0
        self.stomp_bound: list[str] = []
        self.stomp_tls_url = ""  # stomp+ssl://host:port, "" without a STOMP TLS listener
        self.stomp_tls_port = 0
        self.stream_url = ""  # rabbitmq-stream://host:port, "" without a stream listener
        self.stream_port = 0
        self.stream_bound: list[str] = []
        self.stream_tls_url = ""  # rabbitmq-stream+tls://host:port, "" without one
        self.stream_tls_port = 0
        self.mqtt_url = ""  # mqtt://host:port, "" without an MQTT listener
        self.mqtt_port = 0
        self.mqtt_bound: list[str] = []
        self.mqtt_tls_url = ""  # mqtts://host:port, "" without an MQTT TLS listener
        self.mqtt_tls_port = 0
        self.mqtt_ws: Any = None  # server/mqtt/websocket.MQTTWebSocketListener
        self.mqtt_ws_url = ""  # ws://host:port/ws, "" without it
        self.mqtt_wss: Any = None  # the same over TLS
        self.mqtt_wss_url = ""  # wss://host:port/ws, "" without it
        self._tls_ctx: Any = None  # one ssl.SSLContext for every TLS listener
        self._spill_tmp: str | None = None
        self._streams_tmp: str | None = None
        self.access: AccessModel = None  # type: ignore[assignment]  # users, vhosts (U1-U3)
        self.admin: Any = None  # the `ackmq ctl` socket (server/ctl/)
        self.alarms: Any = None  # server/alarms.ResourceMonitor
        self.http: Any = None  # server/http.HttpListener (management API, M1)
        # components plugged in from above (a dynamic shovel), filled by `ackmq serve`
        self.parameters = Parameters()

    @property
    def connections(self) -> set[ClientConnection]:
        return self.ctx.connections if self.ctx is not None else set()

    @property
    def blocking(self) -> bool:
        """U5: True while a resource alarm is set."""
        return self.ctx is not None and self.ctx.blocking

    # -- the model's Scheduler (server/turn.py) ---------------------------------------
    def request_flush(self) -> None:
        self.turn.request_flush()

    # -- life cycle ---------------------------------------------------------------------
    async def start(self) -> str:
        self.loop = asyncio.get_running_loop()
        cfg = self.config
        store = None
        if cfg.data_dir is not None:
            from ackmq.store import open_store
            self._make_data_dir()
            store = open_store(cfg.data_dir, fsync=cfg.fsync,
                               call_soon_threadsafe=self.loop.call_soon_threadsafe)
            if not cfg.fsync:
                log.warning("fsync is OFF (--no-fsync): confirmed persistent messages can be "
                            "lost on a crash or power failure; use only for tests and "
                            "throwaway data")
        spill = None
        if cfg.spill:
            from ackmq.store.spill import Spill
            if cfg.data_dir is not None:
                spill = Spill(cfg.data_dir / "spill")
            else:
                self._spill_tmp = tempfile.mkdtemp(prefix="ackmq-spill-")
                spill = Spill(self._spill_tmp)
        from ackmq.store.streamlog import StreamStore
        if cfg.data_dir is not None:
            streams = StreamStore(cfg.data_dir / "streams", fsync=cfg.fsync,
                                  call_soon_threadsafe=self.loop.call_soon_threadsafe)
        else:
            self._streams_tmp = tempfile.mkdtemp(prefix="ackmq-streams-")
            streams = StreamStore(self._streams_tmp, fsync=False)
        self.turn = Turn(self.loop)
        self.broker = BrokerModel(self.turn, store, consumer_timeout_ms=cfg.consumer_timeout_ms,
                             spill=spill, queue_hot_messages=cfg.queue_hot_messages,
                             queue_memory=cfg.queue_memory_mb << 20, streams=streams)
        self.broker.notify_on_timeout = cfg.consumer_timeout_response != "close_channel"
        self.turn.broker = self.broker
        self._timers = LoopTimers(self.broker.timers, self.loop, self.turn.request_flush)  # C5
        self.access = self._open_access()
        self.broker.vhost_limit = self.access.vhost_limit
        self.broker.schedule_bounds = Bounds(cfg.scheduled_max_repeat,
                                             cfg.scheduled_min_period_ms)
        from ackmq.server import policy_ops
        policy_ops.attach(self.broker, cfg.data_dir)  # before the queues come back
        self.ctx = FrontEnd(self.broker, self.access, cfg, self.loop, self.turn.request_flush,
                            self.alarm_reason)
        self.turn.ctx = self.ctx
        self.ctx.parameters = self.parameters
        self._start_alarms()
        self.broker.start(list(self.access.vhosts))
        self.broker.policies.reapply()  # the amq.* exchanges too
        self.access.listeners.append(self._access_changed)
        self.parameters.attach(cfg.data_dir)
        if cfg.load_definitions is not None:
            from ackmq.server import definitions
            # (an HttpContext for the shovels' parameters; the ports are not bound yet)
            definitions.load_file(HttpContext(self.ctx, self.alarms,
                                              parameters=self.parameters),
                                  cfg.load_definitions)
        host = await self._start_listeners()
        if cfg.mqtt_ws_port is not None:
            self.mqtt_ws, self.mqtt_ws_url = await self._start_mqtt_ws(
                host, cfg.mqtt_ws_port, False)
        if cfg.mqtt_wss_port is not None:
            self.mqtt_wss, self.mqtt_wss_url = await self._start_mqtt_ws(
                host, cfg.mqtt_wss_port, True)
        # what the management front ends (server/http/, server/ctl/) reach
        mgmt = HttpContext(self.ctx, self.alarms, self.port, self.tls_port, self.stomp_port,
                           self.stomp_tls_port, stream_port=self.stream_port,
                           stream_tls_port=self.stream_tls_port, parameters=self.parameters,
                           mqtt_port=self.mqtt_port, mqtt_tls_port=self.mqtt_tls_port,
                           mqtt_ws_port=self.mqtt_ws.port if self.mqtt_ws else 0,
                           mqtt_wss_port=self.mqtt_wss.port if self.mqtt_wss else 0)
        if cfg.http_port is not None or cfg.https_port is not None:
            await self._start_http(host, mgmt)  # the management API (M1), on the same loop
        if cfg.data_dir is not None and cfg.admin_socket:
            from ackmq.server.ctl.listener import CtlListener
            admin = CtlListener(mgmt)
            try:
                await admin.start(cfg.data_dir / ADMIN_SOCKET)
                self.admin = admin
            except OSError as e:  # e.g. a path past the 107 bytes a Unix socket takes
                log.warning("no admin socket (ackmq ctl will not reach this broker): "
                            "%s: %s", cfg.data_dir / ADMIN_SOCKET, e)
        from ackmq.server.views import node_name
        self.parameters.start(host, self.port, node_name(), self.access)
        return self.url

    def _make_data_dir(self) -> None:
        """The data dir, created if missing; a path that cannot be one (a regular file,
        no permission) is a StoreError naming the data dir, not a listener's problem."""
        path = self.config.data_dir
        assert path is not None
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StoreError(f"{path} exists and is not a directory") from None
        except OSError as e:
            raise StoreError(f"cannot create {path}: {e.strerror or e}") from None

    async def _start_listeners(self) -> str:
        """AMQP first (its URL is the broker's), then STOMP (W), AMQPS and STOMP over TLS
        (U4), each where the config asks for one. A port that cannot be bound closes the
        listeners already open and raises the OSError naming it (`.listener`). Returns
        the host the listeners' URLs name."""
        cfg = self.config
        amqp = Listener("AMQP", "amqp", cfg.port, _amqp)
        wanted = [amqp]
        if cfg.stomp_port is not None:
            wanted.append(Listener("STOMP", "stomp", cfg.stomp_port, _stomp))
        if cfg.stream_port is not None:
            wanted.append(Listener("stream", "rabbitmq-stream", cfg.stream_port, _stream))
        if cfg.tls_port is not None:
            wanted.append(Listener("AMQPS", "amqps", cfg.tls_port, _amqp, tls=True))
        if cfg.stomp_tls_port is not None:
            wanted.append(Listener("STOMP over TLS", "stomp+ssl", cfg.stomp_tls_port, _stomp,
                                   tls=True))
        if cfg.stream_tls_port is not None:
            wanted.append(Listener("stream over TLS", "rabbitmq-stream+tls",
                                   cfg.stream_tls_port, _stream, tls=True))
        if cfg.mqtt_port is not None:
            wanted.append(Listener("MQTT", "mqtt", cfg.mqtt_port, _mqtt))
        if cfg.mqtt_tls_port is not None:
            wanted.append(Listener("MQTT over TLS", "mqtts", cfg.mqtt_tls_port, _mqtt,
                                   tls=True))
        host = ""
        for listener in wanted:
            await self._listen(listener)
            self.listeners.append(listener)
            if listener is amqp:
                host = self._first_listener(amqp)
            listener.url = f"{listener.scheme}://{_host_port(host, listener.bound_port)}"
        for listener in wanted[1:]:
            if listener.scheme == "stomp":
                self.stomp_url, self.stomp_port = listener.url, listener.bound_port
                self.stomp_bound = listener.bound
            elif listener.scheme == "rabbitmq-stream":
                self.stream_url, self.stream_port = listener.url, listener.bound_port
                self.stream_bound = listener.bound
            elif listener.scheme == "rabbitmq-stream+tls":
                self.stream_tls_url = listener.url
                self.stream_tls_port = listener.bound_port
            elif listener.scheme == "amqps":
                self.tls_url, self.tls_port = listener.url + "/", listener.bound_port
            elif listener.scheme == "stomp+ssl":
                self.stomp_tls_url, self.stomp_tls_port = listener.url, listener.bound_port
            elif listener.scheme == "mqtt":
                self.mqtt_url, self.mqtt_port = listener.url, listener.bound_port
                self.mqtt_bound = listener.bound
            elif listener.scheme == "mqtts":
                self.mqtt_tls_url, self.mqtt_tls_port = listener.url, listener.bound_port
        return host

    def _first_listener(self, amqp: Listener) -> str:
        """The broker's URL from the AMQP listener; returns the host other URLs name."""
        assert amqp.server is not None
        socks = list(amqp.server.sockets)
        sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
        self.port = amqp.bound_port
        self.bound = amqp.bound
        self.all_interfaces = any(_unspecified(s.getsockname()[0]) for s in socks)
        host = sock.getsockname()[0]
        if _unspecified(host):  # 0.0.0.0 / :: is where to listen, not where to connect
            host = "127.0.0.1" if sock.family == socket.AF_INET else "::1"
        else:
            host = self.config.host or host
        creds = "guest:guest@" if "guest" in self.access.users else ""  # no password shown
        self.url = f"amqp://{creds}{_host_port(host, self.port)}/"
        return host

    async def _listen(self, listener: Listener) -> None:
        """Open one listener: every protocol's connections get the same context."""
        cfg, ctx = self.config, self.ctx
        tls: dict[str, Any] = {}
        if listener.tls:
            tls = {"ssl": self._tls_context(),
                   "ssl_handshake_timeout": cfg.handshake_timeout}
        factory = listener.connection
        try:
            srv = await self.loop.create_server(
                lambda: factory(ctx), cfg.host, listener.port, backlog=1024,
                reuse_address=True, **tls)
        except OSError as e:
            self._close_listeners()
            if self.listeners:  # the first listener's address is the broker's own
                e.listener = (f"{_host_port(cfg.host, listener.port or 0)} "  # type: ignore[attr-defined]
                              f"({listener.name})")
            raise
        listener.server = srv
        socks = list(srv.sockets)
        sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
        listener.bound_port = sock.getsockname()[1]
        listener.bound = [_host_port(s.getsockname()[0], s.getsockname()[1]) for s in socks]

    async def _start_mqtt_ws(self, host: str, port: int, tls: bool) -> tuple[Any, str]:
        """MQTT over WebSocket (server/mqtt/websocket.py), on aiohttp as the management
        API; `tls`: over TLS (wss://) with the certificate options. The listener and its
        URL."""
        from ackmq.server.mqtt.websocket import PATH, MQTTWebSocketListener
        ws = MQTTWebSocketListener(self.ctx)
        ssl_context = self._tls_context() if tls else None
        try:
            await ws.start(self.config.host, port or 0, ssl_context)
        except OSError as e:
            self._close_listeners()
            if self.mqtt_ws is not None:
                await self.mqtt_ws.stop()
            what = "MQTT over secure WebSocket" if tls else "MQTT over WebSocket"
            e.listener = f"{_host_port(self.config.host, port or 0)} ({what})"  # type: ignore[attr-defined]
            raise
        return ws, f"{'wss' if tls else 'ws'}://{_host_port(host, ws.port)}{PATH}"

    def _tls_context(self) -> Any:
        """The certificate options' context, made once; on a bad option the listeners
        already open are closed and TLSConfigError (a ValueError) says what to fix."""
        if self._tls_ctx is None:
            from ackmq.server.tls import server_context
            cfg = self.config
            asked = " / ".join(o for o, p in (("--tls-port", cfg.tls_port),
                                              ("--stomp-tls-port", cfg.stomp_tls_port),
                                              ("--stream-tls-port", cfg.stream_tls_port),
                                              ("--mqtt-tls-port", cfg.mqtt_tls_port),
                                              ("--mqtt-wss-port", cfg.mqtt_wss_port),
                                              ("--https-port", cfg.https_port))
                               if p is not None)
            try:
                self._tls_ctx = server_context(cfg.tls_cert, cfg.tls_key, cfg.tls_ca,
                                               cfg.tls_verify_peer,
                                               cfg.tls_fail_if_no_peer_cert, asked)
            except ValueError:
                self._close_listeners()
                raise
        return self._tls_ctx

    def _close_listeners(self) -> None:
        for listener in self.listeners:
            if listener.server is not None:
                listener.server.close()

    async def _start_http(self, host: str, mgmt: HttpContext) -> None:
        """The management API (M1) on the broker's loop (server/http/)."""
        from ackmq.server.http import HttpListener
        http = HttpListener(mgmt)
        ctx = self._tls_context() if self.config.https_port is not None else None
        try:
            await http.start(host, self.config.http_port, self.config.https_port, ctx)
        except OSError:
            self._close_listeners()
            raise
        self.http = http

    # -- resource alarms (U5) -------------------------------------------------------------
    def _start_alarms(self) -> None:
        from ackmq.server.alarms import (
            Limits,
            ResourceMonitor,
            parse_disk_limit,
            parse_watermark,
            total_memory,
        )
        cfg = self.config
        limits = Limits(parse_watermark(cfg.memory_high_watermark),
                        parse_disk_limit(cfg.disk_free_limit), total_memory())
        self.alarms = ResourceMonitor(
            self.broker.timers, limits, cfg.data_dir, self._alarms_changed,
            f"ackmq@{socket.gethostname().split('.')[0]}",
            memory_interval=cfg.memory_check_interval, disk_interval=cfg.disk_check_interval,
            set_paging=self._set_paging, page_out=self.broker.page_out)
        self.alarms.start()

    def _set_paging(self, on: bool) -> None:
        """Above half the watermark (RabbitMQ's paging ratio) queues keep no more new
        messages in memory than their 512 each; below it, up to --queue-memory-mb."""
        self.broker.hot_budget.limit = 0 if on else self.config.queue_memory_mb << 20

    def alarm_reason(self) -> str:
        return self.alarms.limits.reason() if self.alarms is not None else ""

    def _alarms_changed(self, active: set[str]) -> None:
        """Publishes are checked against `blocking`; once every alarm clears, the
        connections blocked meanwhile are read again (and told connection.unblocked)."""
        self.ctx.blocking = bool(active)
        if not active:
            for conn in list(self.connections):
                conn.alarm_cleared()
        self.request_flush()

    def _open_access(self) -> AccessModel:
        """U1: the users, vhosts and permissions saved in the data dir, or on first start
        the default user(s) (guest/guest, or --default-user) with full rights on "/"."""
        cfg = self.config
        if cfg.data_dir is None:
            return AccessModel.seeded(cfg.seed_users(), None)
        from ackmq.store.accessfile import AccessFile
        af = AccessFile(cfg.data_dir, fsync=cfg.fsync)
        try:
            data = af.load()
            if data is None:
                model = AccessModel.seeded(cfg.seed_users(), af.save)
                model.save = af.submit  # from now on off the loop (server/durable.py)
                log.info("first start: created user(s) %s with full permissions on vhost /",
                         ", ".join(sorted(model.users)))
                return model
            if cfg.default_user:
                log.info("--default-user is used on first start only: %s exists", af.path)
            return AccessModel.load(data, af.submit)
        except (ValueError, KeyError, TypeError, AccessError) as e:
            raise CorruptStore(f"{af.path}: {e}") from e

    def _access_changed(self, kind: str, name: str) -> None:
        """Apply an admin change to the running broker (U2)."""
        if kind == "vhost":
            self.broker.add_vhost(name)
        elif kind == "delete_vhost":
            for conn in list(self.connections):
                if conn.vhost_name == name:
                    conn.force_close(f"vhost '{name}' is deleted")
            self.broker.delete_vhost(name)
            self.parameters.vhost_deleted(name)
            self.request_flush()
        elif kind == "delete_user":  # as RabbitMQ 3.10: the user's connections go
            for conn in list(self.connections):
                if conn.user == name and conn.vhost_name is not None:
                    conn.force_close(f"user '{name}' is deleted")
            self.broker.user_deleted(name)  # and the schedules they made
            self.request_flush()

    async def stop(self) -> None:
        """Close connections with 320 CONNECTION_FORCED, then the store."""
        await self.parameters.stop()
        if self.admin is not None:
            await self.admin.stop()
        if self.http is not None:
            await self.http.stop()
        for ws in (self.mqtt_ws, self.mqtt_wss):
            if ws is not None:
                await ws.stop()
        if self.alarms is not None:
            self.alarms.stop()
        self._close_listeners()
        for conn in list(self.connections):
            conn.force_close("broker forced connection closure with reason 'shutdown'")
        if self.ctx is not None:
            self.turn.flush()
        deadline = self.loop.time() + 2.0
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        for listener in self.listeners:
            if listener.server is not None:
                await listener.server.wait_closed()
        # let the last commit callbacks run before closing the store
        await asyncio.sleep(0)
        if self.ctx is not None:  # MQTT's logs beside the store (server/mqtt/state.py)
            for state in self.ctx.protocol_state.values():
                state.close()
        if self._timers is not None:  # no deadline fires against the closing store
            self._timers.close()
        if self.broker is not None:
            await self.loop.run_in_executor(None, self.broker.close)
        if self._spill_tmp:
            shutil.rmtree(self._spill_tmp, ignore_errors=True)
        if self._streams_tmp:
            shutil.rmtree(self._streams_tmp, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        return {
            "connections": len(self.connections),
            "queues": {q.name: {"messages": q.message_count, "unacked": q.unacked_count,
                                "consumers": q.consumer_count}
                       for q in self.broker.queues()},
        }
