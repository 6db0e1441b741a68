"""What MQTT keeps beside the queues, once per broker: who holds which client id (session
takeover), the retained messages (N5) and the QoS 2 packet identifiers received and not
yet released (N3), durable in the data dir (store/kvlog.py: `mqtt-retained.log`,
`mqtt-qos2.log`), and the wills waiting for their delay (N6). The ids received (QoS 2
in) are notes in the message store itself (store/notes.py), written in the frame of
their message: both survive a power cut or neither (docs/mqtt.md, "QoS 2 across a power
cut"); `mqtt-qos2.log` keeps the ids sent (out), and received ones without a store.

Sessions themselves are queues and bindings (`mqtt-subscription-<client id>qos<n>` on
amq.topic, as RabbitMQ's plugin names them): the store keeps them like any other."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ackmq.broker.timers import Deadline
from ackmq.protocol.mqtt.topics import matches

if TYPE_CHECKING:
    from ackmq.broker.storage import Store
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.mqtt")
_RETAINED = struct.Struct(">BI")  # qos, properties length; then properties, payload
_NOTE = b"mqtt-qos2-in\x00"  # + vhost NUL client NUL packet id: a QoS 2 id received
# with this bit in the qos byte, the expiry (ms since the epoch) follows the struct
_EXPIRES = 0x80
_AT = struct.Struct(">Q")


@dataclass(slots=True)
class Retained:
    topic: str
    qos: int
    properties: bytes  # AMQP properties, as the message was routed
    payload: bytes
    expires_at: float | None = None  # wall clock (it holds across restarts), 5.0's expiry

    def left_ms(self, now: float) -> int | None:
        """What is left of its Message Expiry Interval ([MQTT-3.3.2-6])."""
        return None if self.expires_at is None else max(0, int((self.expires_at - now)
                                                               * 1000))


@dataclass(eq=False)
class MQTTState:
    """One per broker model (`state_of(ctx)`)."""

    ctx: FrontEnd
    sessions: dict[tuple[str, str], Any] = field(default_factory=dict)  # (vhost, id) -> conn
    retained: dict[str, dict[str, Retained]] = field(default_factory=dict)  # vhost -> topic
    # ("in" | "out", vhost, client id) -> packet ids
    qos2: dict[tuple[str, str, str], set[int]] = field(default_factory=dict)
    wills: dict[tuple[str, str], Deadline] = field(default_factory=dict)
    _after: list[Callable[[], None]] = field(default_factory=list)  # after_sync's
    _syncing: bool = False  # a sync thread is at work for the answers taken from _after
    _retained_log: Any = None
    _qos2_log: Any = None

    def open(self) -> None:
        cfg = self.ctx.config
        if cfg.data_dir is None:
            return
        from ackmq.store.kvlog import KVLog
        self._retained_log = KVLog(cfg.data_dir, "mqtt-retained", cfg.fsync)
        for key, value in self._retained_log.items.items():
            vhost, _, topic = key.decode("utf-8", "surrogateescape").partition("\x00")
            qos, plen = _RETAINED.unpack_from(value)
            start = _RETAINED.size
            at = None
            if qos & _EXPIRES:
                qos &= ~_EXPIRES
                at = _AT.unpack_from(value, start)[0] / 1000
                start += _AT.size
            self.retained.setdefault(vhost, {})[topic] = Retained(
                topic, qos, value[start:start + plen], value[start + plen:], at)
        self._qos2_log = KVLog(cfg.data_dir, "mqtt-qos2", cfg.fsync)
        for key in self._qos2_log.items:  # received ids here: a data dir of an older ackmq
            way, vhost, client, pid = key.decode("utf-8", "surrogateescape").split("\x00")
            self.qos2.setdefault((way, vhost, client), set()).add(int(pid))
        store = self._store()
        for key in store.notes() if store is not None else ():
            if key.startswith(_NOTE):
                vhost, client, pid = key[len(_NOTE):].decode(
                    "utf-8", "surrogateescape").split("\x00")
                self.qos2.setdefault(("in", vhost, client), set()).add(int(pid))

    def _store(self) -> Store | None:
        broker = getattr(self.ctx, "broker", None)  # crashsim's kvsim drives the logs alone
        return broker.store if broker is not None else None

    def sync(self) -> None:
        """Make the retained and QoS 2 changes so far durable (before acknowledging)."""
        for log in (self._retained_log, self._qos2_log):
            if log is not None:
                log.sync()

    @property
    def waiting(self) -> bool:
        """Changes not yet synced, or answers waiting for a sync (an answer that needs
        none still waits its turn behind them: MQTT keeps acknowledgements in order)."""
        return bool(self._after) or self._syncing or any(
            log is not None and log.dirty for log in (self._retained_log, self._qos2_log))

    def after_sync(self, fn: Callable[[], None]) -> None:
        """Call `fn` once what was written so far is durable: the fdatasync runs on a
        thread (the loop serves everyone meanwhile), one for every answer asked for
        while the one before ran, and the answers go in the order asked."""
        self._after.append(fn)
        if len(self._after) == 1 and not self._syncing:
            self.ctx.loop.call_soon(self._sync_now)

    def _sync_now(self) -> None:
        if self._syncing or not self._after:
            return
        fns, self._after = self._after, []
        logs = [x for x in (self._retained_log, self._qos2_log) if x is not None and x.dirty]
        if not logs:
            self._answer(fns)
            return
        for x in logs:
            x.dirty = False  # what is appended from now on needs the next sync
        self._syncing = True
        fut = self.ctx.loop.run_in_executor(None, _fsync_all, logs)
        fut.add_done_callback(lambda f: self._synced(f, fns))

    def _synced(self, f: asyncio.Future[None], fns: list[Callable[[], None]]) -> None:
        self._syncing = False
        exc = f.exception()
        if exc is not None:  # nothing is acknowledged that is not on disk
            log.error("MQTT state sync failed, %d answers withheld: %s", len(fns), exc)
            for x in (self._retained_log, self._qos2_log):
                if x is not None:
                    x.dirty = True
        else:
            self._answer(fns)
        if self._after:
            self.ctx.loop.call_soon(self._sync_now)

    def _answer(self, fns: list[Callable[[], None]]) -> None:
        for fn in fns:
            fn()
        self.ctx.request_flush()

    # -- retained messages (N5) ----------------------------------------------------------
    def retain(self, vhost: str, topic: str, qos: int, properties: bytes,
               payload: bytes, expiry: int | None = None) -> None:
        """Keep (or, with an empty payload, clear) the retained message of `topic`;
        `expiry`: its Message Expiry Interval (s), after which it is gone ([MQTT-3.3.2-5])."""
        key = f"{vhost}\x00{topic}".encode("utf-8", "surrogateescape")
        if not payload:
            kept = self.retained.get(vhost)
            if kept is not None:
                kept.pop(topic, None)
            if self._retained_log is not None:
                self._retained_log.delete(key)
            return
        at = None if expiry is None else time.time() + expiry
        self.retained.setdefault(vhost, {})[topic] = Retained(topic, qos, properties, payload,
                                                              at)
        if self._retained_log is not None:
            head = _RETAINED.pack(qos, len(properties)) if at is None else \
                _RETAINED.pack(qos | _EXPIRES, len(properties)) + _AT.pack(int(at * 1000))
            self._retained_log.put(key, head + properties + payload)

    def retained_for(self, vhost: str, flt: str, now: float) -> list[Retained]:
        """The retained messages a filter matches; those expired go (from disk too)."""
        kept = self.retained.get(vhost, {})
        out = []
        for t, r in list(kept.items()):
            if not matches(flt, t):
                continue
            if r.expires_at is not None and r.expires_at <= now:
                self.retain(vhost, t, 0, b"", b"")
                continue
            out.append(r)
        return out

    # -- QoS 2 packet identifiers (N3) ----------------------------------------------------
    # in: received from the client, PUBREC sent, PUBREL awaited (a resend is no copy);
    # out: PUBREC received from the client, PUBREL sent, PUBCOMP awaited (resent on return)
    def qos2_ids(self, vhost: str, client: str, out: bool = False) -> set[int]:
        return self.qos2.setdefault(("out" if out else "in", vhost, client), set())

    @staticmethod
    def _qos2_key(vhost: str, client: str, pid: int, out: bool) -> bytes:
        return f"{'out' if out else 'in'}\x00{vhost}\x00{client}\x00{pid}".encode(
            "utf-8", "surrogateescape")

    @staticmethod
    def _note_key(vhost: str, client: str, pid: int) -> bytes:
        return _NOTE + f"{vhost}\x00{client}\x00{pid}".encode("utf-8", "surrogateescape")

    def qos2_note(self, vhost: str, client: str, pid: int) -> bool:
        """A QoS 2 PUBLISH was just routed (this loop turn): its id goes into the store's
        batch after the message, so one fdatasync makes both durable. False: no store."""
        store = self._store()
        if store is None:
            return False
        store.note(self._note_key(vhost, client, pid))
        return True

    def qos2_noted(self) -> bool:
        """Received ids are notes in the store (else in `mqtt-qos2.log`, or memory)."""
        return self._store() is not None

    def qos2_add(self, vhost: str, client: str, pid: int, out: bool = False) -> None:
        """The id is known (in: its message confirmed, and noted with it if a store)."""
        self.qos2_ids(vhost, client, out).add(pid)
        if self._qos2_log is not None and (out or self._store() is None):
            self._qos2_log.put(self._qos2_key(vhost, client, pid, out), b"")

    def qos2_unnote(self, vhost: str, client: str, pid: int) -> None:
        """The message was refused: its note goes (the id was never known)."""
        store = self._store()
        if store is not None:
            store.forget(self._note_key(vhost, client, pid))

    def qos2_remove(self, vhost: str, client: str, pid: int, out: bool = False) -> bool:
        ids = self.qos2.get(("out" if out else "in", vhost, client))
        if ids is None or pid not in ids:
            return False
        ids.discard(pid)
        if self._qos2_log is not None:  # (a received id may be in it from an older ackmq)
            self._qos2_log.delete(self._qos2_key(vhost, client, pid, out))
        if not out:
            self.qos2_unnote(vhost, client, pid)
        return True

    def forget_session(self, vhost: str, client: str) -> None:
        """A clean start or a session's end: its QoS 2 state goes with it."""
        for out in (False, True):
            for pid in list(self.qos2.get(("out" if out else "in", vhost, client), ())):
                self.qos2_remove(vhost, client, pid, out)
            self.qos2.pop(("out" if out else "in", vhost, client), None)

    def close(self) -> None:
        """Broker stop: wills still delayed are not published (the broker is going)."""
        for timer in self.wills.values():
            timer.cancel()
        self.wills.clear()
        for x in (self._retained_log, self._qos2_log):
            if x is not None:
                x.close()
        self._retained_log = self._qos2_log = None


def _fsync_all(logs: list[Any]) -> None:
    for x in logs:
        x.fsync_now()


def state_of(ctx: FrontEnd) -> MQTTState:
    """The broker's MQTT state, opened on first use (the first MQTT connection)."""
    st: MQTTState | None = ctx.protocol_state.get("mqtt")
    if st is None:
        st = ctx.protocol_state["mqtt"] = MQTTState(ctx)
        st.open()
    return st
