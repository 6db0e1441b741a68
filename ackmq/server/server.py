"""The asyncio server: listening socket, connections, and the once-per-turn flush.

`request_flush()` schedules one callback for the end of the current loop turn: it runs the
broker's end-of-turn work (group commit, coalesced confirms) and then writes every
connection's buffered frames with one `writelines` each.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
import socket
import tempfile
from collections.abc import Callable
from typing import Any

from ackmq.broker import BrokerModel
from ackmq.broker.access import AccessError, AccessModel
from ackmq.broker.storage import CorruptStore
from ackmq.server.config import Config
from ackmq.server.connection import AMQPConnection, vhost_name

log = logging.getLogger("ackmq.server")

ADMIN_SOCKET = "ctl.sock"


def _unspecified(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_unspecified
    except ValueError:
        return False


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Server:
    """One broker process (or one embedded broker): the model plus its sockets."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.broker: BrokerModel = None  # type: ignore[assignment]
        self.connections: set[Any] = set()  # AMQPConnection and StompConnection
        self.dirty: list[Any] = []
        self._flush_scheduled = False
        self._server: asyncio.AbstractServer | None = None
        self.url = ""  # for a client on this machine (loopback when bound to all interfaces)
        self.port = 0
        self._stomp_server: asyncio.AbstractServer | None = None
        self._tls_server: asyncio.AbstractServer | None = None
        self.tls_url = ""  # amqps://host:port/, "" without a TLS listener
        self.tls_port = 0
        self.stomp_url = ""  # stomp://host:port, "" without a STOMP listener
        self.stomp_port = 0
        self.stomp_bound: list[str] = []
        self._stomp_tls_server: asyncio.AbstractServer | None = None
        self.stomp_tls_url = ""  # stomp+ssl://host:port, "" without a STOMP TLS listener
        self.stomp_tls_port = 0
        self._tls_ctx: Any = None  # one ssl.SSLContext for every TLS listener
        self.bound: list[str] = []  # host:port of each listening socket
        self.all_interfaces = False  # bound to 0.0.0.0 and/or ::
        self._spill_tmp: str | None = None
        self.access: AccessModel = None  # type: ignore[assignment]  # users, vhosts (U1-U3)
        self.admin: Any = None  # the `ackmq ctl` socket (server/admin.py)
        # U5: True while a resource alarm is set; read once per read by each connection
        self.blocking = False
        self.alarms: Any = None  # server/alarms.ResourceMonitor
        self.http: Any = None  # server/http.HttpListener (management API, M1)

    # -- Scheduler for the model -------------------------------------------------------
    def call_later(self, delay: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        def run() -> None:
            fn()
            self.request_flush()
        return self.loop.call_later(delay, run)

    def request_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        try:
            self.broker.end_of_turn()
        except Exception:  # never let one bad turn stop every connection's output
            log.exception("end of turn failed")
        dirty, self.dirty = self.dirty, []
        for conn in dirty:
            conn.flush()

    # -- life cycle ---------------------------------------------------------------------
    async def start(self) -> str:
        self.loop = asyncio.get_running_loop()
        cfg = self.config
        store = None
        if cfg.data_dir is not None:
            from ackmq.store import open_store
            cfg.data_dir.mkdir(parents=True, exist_ok=True)
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
        self.broker = BrokerModel(self, store, consumer_timeout_ms=cfg.consumer_timeout_ms,
                             spill=spill, queue_hot_messages=cfg.queue_hot_messages,
                             queue_memory=cfg.queue_memory_mb << 20)
        self.access = self._open_access()
        self._start_alarms()
        cfg.access = self.access  # Config.authenticate (AMQP, STOMP) checks its users
        self.broker.start(list(self.access.vhosts))
        self.access.listeners.append(self._access_changed)
        self._server = await self.loop.create_server(
            lambda: AMQPConnection(self), cfg.host, cfg.port, backlog=1024, reuse_address=True)
        socks = list(self._server.sockets)
        # the URL names the IPv4 socket when there is one ("" binds both families)
        sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
        self.port = sock.getsockname()[1]
        self.bound = [_host_port(s.getsockname()[0], s.getsockname()[1]) for s in socks]
        self.all_interfaces = any(_unspecified(s.getsockname()[0]) for s in socks)
        host = sock.getsockname()[0]
        if _unspecified(host):  # 0.0.0.0 / :: is where to listen, not where to connect
            host = "127.0.0.1" if sock.family == socket.AF_INET else "::1"
        else:
            host = cfg.host or host
        creds = "guest:guest@" if "guest" in self.access.users else ""  # no password shown
        self.url = f"amqp://{creds}{_host_port(host, self.port)}/"
        if cfg.stomp_port is not None:
            await self._start_stomp(host)
        if cfg.tls_port is not None:
            await self._start_tls(host)
        if cfg.stomp_tls_port is not None:
            await self._start_stomp_tls(host)
        if cfg.http_port is not None or cfg.https_port is not None:
            await self._start_http(host)
        if cfg.data_dir is not None and cfg.admin_socket:
            from ackmq.server.admin import AdminServer
            admin = AdminServer(self)
            try:
                await admin.start(cfg.data_dir / ADMIN_SOCKET)
                self.admin = admin
            except OSError as e:  # e.g. a path past the 107 bytes a Unix socket takes
                log.warning("no admin socket (ackmq ctl will not reach this broker): "
                            "%s: %s", cfg.data_dir / ADMIN_SOCKET, e)
        return self.url

    async def _start_stomp(self, host: str) -> None:
        """The STOMP listener (SPEC W) on the same host; `stomp_port` 0 picks a free port.
        A port that cannot be bound is an OSError naming it (`.listener`)."""
        from ackmq.server.stomp import StompConnection
        cfg = self.config
        try:
            self._stomp_server = await self.loop.create_server(
                lambda: StompConnection(self), cfg.host, cfg.stomp_port, backlog=1024,
                reuse_address=True)
        except OSError as e:
            if self._server is not None:
                self._server.close()
            e.listener = f"{_host_port(cfg.host, cfg.stomp_port or 0)} (STOMP)"  # type: ignore[attr-defined]
            raise
        socks = list(self._stomp_server.sockets)
        sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
        self.stomp_port = sock.getsockname()[1]
        self.stomp_bound = [_host_port(s.getsockname()[0], s.getsockname()[1]) for s in socks]
        self.stomp_url = f"stomp://{_host_port(host, self.stomp_port)}"

    def _tls_context(self) -> Any:
        """The certificate options' context, made once; on a bad option the listeners
        already open are closed and TLSConfigError (a ValueError) says what to fix."""
        if self._tls_ctx is None:
            from ackmq.server.tls import server_context
            cfg = self.config
            asked = " / ".join(o for o, p in (("--tls-port", cfg.tls_port),
                                              ("--stomp-tls-port", cfg.stomp_tls_port),
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
        for listener in (self._server, self._stomp_server, self._tls_server,
                         self._stomp_tls_server):
            if listener is not None:
                listener.close()

    async def _listen_tls(self, factory: Callable[[], Any], port: int, what: str
                          ) -> tuple[asyncio.AbstractServer, int]:
        cfg = self.config
        ctx = self._tls_context()
        try:
            srv = await self.loop.create_server(
                factory, cfg.host, port, ssl=ctx, backlog=1024, reuse_address=True,
                ssl_handshake_timeout=cfg.handshake_timeout)
        except OSError as e:
            self._close_listeners()
            e.listener = f"{_host_port(cfg.host, port or 0)} ({what})"  # type: ignore[attr-defined]
            raise
        socks = list(srv.sockets)
        sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
        return srv, sock.getsockname()[1]

    async def _start_tls(self, host: str) -> None:
        """AMQPS (U4): the same connections over TLS on their own port."""
        assert self.config.tls_port is not None
        self._tls_server, self.tls_port = await self._listen_tls(
            lambda: AMQPConnection(self), self.config.tls_port, "AMQPS")
        self.tls_url = f"amqps://{_host_port(host, self.tls_port)}/"

    async def _start_stomp_tls(self, host: str) -> None:
        """STOMP over TLS (U4), RabbitMQ's stomp.listeners.ssl: the STOMP connections
        of the plain listener, on their own port with the same certificate options."""
        from ackmq.server.stomp import StompConnection
        assert self.config.stomp_tls_port is not None
        self._stomp_tls_server, self.stomp_tls_port = await self._listen_tls(
            lambda: StompConnection(self), self.config.stomp_tls_port, "STOMP over TLS")
        self.stomp_tls_url = f"stomp+ssl://{_host_port(host, self.stomp_tls_port)}"

    async def _start_http(self, host: str) -> None:
        """The management API (M1) on the broker's loop (server/http/)."""
        from ackmq.server.http import HttpListener
        http = HttpListener(self)
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
            self.loop, limits, cfg.data_dir, self._alarms_changed,
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
        self.blocking = bool(active)
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
                log.info("first start: created user(s) %s with full permissions on vhost /",
                         ", ".join(sorted(model.users)))
                return model
            if cfg.default_user:
                log.info("--default-user is used on first start only: %s exists", af.path)
            return AccessModel.load(data, af.save)
        except (ValueError, KeyError, TypeError, AccessError) as e:
            raise CorruptStore(f"{af.path}: {e}") from e

    def _access_changed(self, kind: str, name: str) -> None:
        """Apply an admin change to the running broker (U2)."""
        if kind == "vhost":
            self.broker.add_vhost(name)
        elif kind == "delete_vhost":
            for conn in list(self.connections):
                if vhost_name(conn) == name:
                    conn.force_close(f"vhost '{name}' is deleted")
            self.broker.delete_vhost(name)
            self.request_flush()
        elif kind == "delete_user":  # as RabbitMQ 3.10: the user's connections go
            for conn in list(self.connections):
                if conn.user == name and vhost_name(conn) is not None:
                    conn.force_close(f"user '{name}' is deleted")
            self.request_flush()

    async def stop(self) -> None:
        """Close connections with 320 CONNECTION_FORCED, then the store."""
        if self.admin is not None:
            await self.admin.stop()
        if self.http is not None:
            await self.http.stop()
        if self.alarms is not None:
            self.alarms.stop()
        if self._server is not None:
            self._server.close()
        for listener in (self._stomp_server, self._tls_server, self._stomp_tls_server):
            if listener is not None:
                listener.close()
        for conn in list(self.connections):
            conn.force_close("broker forced connection closure with reason 'shutdown'")
        self._flush()
        deadline = self.loop.time() + 2.0
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        for listener in (self._stomp_server, self._tls_server, self._stomp_tls_server):
            if listener is not None:
                await listener.wait_closed()
        # let the last commit callbacks run before closing the store
        await asyncio.sleep(0)
        if self.broker is not None:
            await self.loop.run_in_executor(None, self.broker.close)
        if self._spill_tmp:
            shutil.rmtree(self._spill_tmp, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        return {
            "connections": len(self.connections),
            "queues": {q.name: {"messages": q.message_count, "unacked": q.unacked_count,
                                "consumers": q.consumer_count}
                       for q in self.broker.queues()},
        }
