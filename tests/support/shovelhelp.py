"""Shovel tests' helpers: a `Side` is one broker's management API and AMQP URL in a
vhost of the test's own (made and deleted around the test), ackmq (`ackmq serve`, which
registers the shovel component) or the reference RabbitMQ 3.10 with its shovel plugin.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika
from conftest import BrokerProcess

from support.mgmthelp import Reply, Target, q

RABBIT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def http_target(b: BrokerProcess) -> Target:
    line = next(x for x in reversed(b.log) if "listening on" in x)
    return Target("ackmq", line.split(" and ")[-1].split(" ")[0], b.url)


@dataclass
class Side:
    kind: str
    t: Target
    vhost: str
    amqp_base: str  # amqp://user:pass@host:port/

    @property
    def amqp(self) -> str:
        """pika's URL into the test's vhost."""
        return self.amqp_base.rstrip("/") + "/" + q(self.vhost)

    @property
    def local(self) -> str:
        """A shovel URI meaning this broker, in the test's vhost."""
        return "amqp:///" + q(self.vhost)

    @property
    def remote(self) -> str:
        """A shovel URI reaching this broker over the network."""
        return self.amqp

    def put(self, name: str, value: Any) -> Reply:
        return self.t.call("PUT", f"/api/parameters/shovel/{q(self.vhost)}/{q(name)}",
                           {"value": value})

    def delete(self, name: str) -> Reply:
        return self.t.call("DELETE", f"/api/parameters/shovel/{q(self.vhost)}/{q(name)}")

    def shovels(self) -> list[dict[str, Any]]:
        r = self.t.call("GET", f"/api/shovels/{q(self.vhost)}")
        assert r.status == 200, r
        return list(r.body)

    def status(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.shovels() if s["name"] == name), None)

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = cond()
            if got:
                return got
            assert time.monotonic() < deadline, f"{self.kind}: {what}"
            time.sleep(0.1)

    def wait_state(self, name: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait(lambda: (s := self.status(name)) is not None and s["state"] == state
                         and s, f"shovel {name} {state}", timeout)

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.amqp))

    def depth(self, queue: str) -> int:
        """Ready messages; -1 while the queue is not there (the shovel declares it)."""
        conn = self.connect()
        try:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code != 404:
                raise
            return -1
        finally:
            if conn.is_open:
                conn.close()

    def publish(self, queue: str, n: int, start: int = 0, declare: bool = True,
                size: int = 0, dedup: bool = False) -> None:
        """`n` persistent messages m<i> (message id id<i>), committed in transactions of
        500 (a commit answers once they are stored: faster than one confirm each)."""
        conn = self.connect()
        ch = conn.channel()
        if declare:
            ch.queue_declare(queue, durable=True)
        ch.tx_select()
        pad = b"." * size
        for i in range(start, start + n):
            headers = {"x-deduplication-header": f"id{i}"} if dedup else None
            ch.basic_publish("", queue, b"m%d" % i + pad, pika.BasicProperties(
                delivery_mode=2, message_id=f"id{i}", headers=headers))
            if (i - start) % 500 == 499:
                ch.tx_commit()
        ch.tx_commit()
        conn.close()

    def drain(self, queue: str) -> list[tuple[bytes, Any]]:
        conn = self.connect()
        ch = conn.channel()
        out = []
        while True:
            m, props, body = ch.basic_get(queue, auto_ack=True)
            if m is None:
                break
            out.append((body, props))
        conn.close()
        return out


def make_side(kind: str, t: Target, amqp_base: str) -> Side:
    vhost = f"moving-{uuid.uuid4().hex[:8]}"
    assert t.call("PUT", f"/api/vhosts/{q(vhost)}").status in (201, 204)
    assert t.call("PUT", f"/api/permissions/{q(vhost)}/guest",
                  {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    return Side(kind, t, vhost, amqp_base)


def drop_side(s: Side) -> None:
    for sh in s.t.call("GET", f"/api/parameters/shovel/{q(s.vhost)}").body or []:
        s.delete(sh["name"])
    s.t.call("DELETE", f"/api/vhosts/{q(s.vhost)}")
