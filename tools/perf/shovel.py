"""A shovel's throughput (issue 38): a backlog of N persistent messages moved by an
on-confirm dynamic shovel — ackmq to itself, ackmq to RabbitMQ, and RabbitMQ's own
shovel on the same RabbitMQ node for comparison. Each run uses a vhost of its own
(deleted after); the time is from the PUT of the shovel to the last message counted at
the destination (polled every 50 ms). Wall-clock rates depend on the machine's load:
compare them only with RabbitMQ's measured in the same run. For ackmq's own moves the
broker process's CPU time per message moved is printed too (psutil, user + system:
the shovel and both ends run in it), which the load moves much less.

    python -m tools.perf.shovel --messages 20000 --size 100
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import re
import time
import uuid
from typing import Any
from urllib.parse import quote

import pika
import psutil

from tools.harness.ownbroker import OwnBroker

RABBIT_HTTP = "127.0.0.1:15672"
RABBIT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def call(host: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(host, timeout=30)
    h = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
         "Content-Type": "application/json"}
    conn.request(method, path, json.dumps(body) if body is not None else None, h)
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    return r.status, (json.loads(raw) if raw else None)


def vhost(host: str) -> str:
    name = f"shovel-perf-{uuid.uuid4().hex[:6]}"
    call(host, "PUT", f"/api/vhosts/{name}")
    call(host, "PUT", f"/api/permissions/{name}/guest",
         {"configure": ".*", "write": ".*", "read": ".*"})
    return name


def fill(amqp: str, vh: str, n: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp.rstrip("/") + "/" + vh))
    ch = conn.channel()
    ch.queue_declare("src", durable=True)
    ch.tx_select()
    body = b"x" * size
    for i in range(n):
        ch.basic_publish("", "src", body, pika.BasicProperties(delivery_mode=2))
        if i % 1000 == 999:
            ch.tx_commit()
    ch.tx_commit()
    conn.close()


def depth(amqp: str, vh: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(amqp.rstrip("/") + "/" + vh))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if conn.is_open:
            conn.close()


def cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def move(src_http: str, src_amqp: str, dest_amqp: str, dest_vh: str, n: int,
         size: int, dest_uri: str, amqp10_src: str | None = None,
         pid: int | None = None) -> float:
    """`amqp10_src`: both ends AMQP 1.0, the source URI with `{vhost}` to fill in (and
    `dest_uri` a 1.0 URI). `pid`: the ackmq broker whose CPU time per message to print."""
    vh = vhost(src_http)
    fill(src_amqp, vh, n, size)
    c0 = cpu(pid)
    t0 = time.monotonic()
    value: dict[str, Any] = {
        "src-uri": f"amqp:///{quote(vh, safe='')}", "src-queue": "src",
        "dest-uri": dest_uri, "dest-queue": f"dst-{vh}", "ack-mode": "on-confirm"}
    if amqp10_src is not None:
        value = {"src-protocol": "amqp10", "src-uri": amqp10_src.format(vhost=vh),
                 "src-address": "/amq/queue/src", "dest-protocol": "amqp10",
                 "dest-uri": dest_uri, "dest-address": f"/queue/dst-{vh}",
                 "ack-mode": "on-confirm"}
    status, body = call(src_http, "PUT", f"/api/parameters/shovel/{vh}/perf",
                        {"value": value})
    assert status == 201, (status, body)
    while depth(dest_amqp, dest_vh, f"dst-{vh}") < n:
        time.sleep(0.05)
    took = time.monotonic() - t0
    if pid is not None:
        print(f"  (ackmq broker CPU: {(cpu(pid) - c0) * 1e6 / n:,.0f} us per message)")
    call(src_http, "DELETE", f"/api/vhosts/{vh}")
    return n / took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--amqp10", action="store_true",
                   help="both ends AMQP 1.0 (ackmq's shovel, and RabbitMQ's amqp10 shovel)")
    a = p.parse_args()
    if a.amqp10:
        amqp10(a.messages, a.size)
        return
    own = OwnBroker([])
    own.start()
    http_url = re.search(r"and http://(\S+)", own.log_path.read_text()).group(1)  # type: ignore[union-attr]
    try:
        vh = vhost(http_url)
        pid = own.proc.pid if own.proc is not None else None
        rate = move(http_url, own.url, own.url, vh, a.messages, a.size,
                    f"amqp:///{vh}", pid=pid)
        print(f"ackmq -> ackmq (same broker): {rate:,.0f} msg/s")
        rvh = vhost(RABBIT_HTTP)
        try:
            rate = move(http_url, own.url, RABBIT_AMQP, rvh, a.messages, a.size,
                        RABBIT_AMQP.rstrip("/") + "/" + rvh, pid=pid)
            print(f"ackmq -> RabbitMQ: {rate:,.0f} msg/s")
            rate = move(RABBIT_HTTP, RABBIT_AMQP, RABBIT_AMQP, rvh, a.messages, a.size,
                        f"amqp:///{rvh}")
            print(f"RabbitMQ -> RabbitMQ (its own shovel, same node): {rate:,.0f} msg/s")
        finally:
            call(RABBIT_HTTP, "DELETE", f"/api/vhosts/{rvh}")
    finally:
        own.stop()


def amqp10(n: int, size: int) -> None:
    own = OwnBroker([])
    own.start()
    http_url = re.search(r"and http://(\S+)", own.log_path.read_text()).group(1)  # type: ignore[union-attr]
    rabbit10 = "amqp://guest:guest@127.0.0.1:5672?hostname=vhost:{vhost}"
    try:
        pid = own.proc.pid if own.proc is not None else None
        vh = vhost(http_url)
        rate = move(http_url, own.url, own.url, vh, n, size, f"amqp:///{vh}",
                    amqp10_src="amqp:///{vhost}", pid=pid)
        print(f"AMQP 1.0 ackmq -> ackmq (same broker): {rate:,.0f} msg/s")
        rvh = vhost(RABBIT_HTTP)
        try:
            rate = move(http_url, own.url, RABBIT_AMQP, rvh, n, size,
                        rabbit10.format(vhost=rvh), amqp10_src="amqp:///{vhost}", pid=pid)
            print(f"AMQP 1.0 ackmq -> RabbitMQ: {rate:,.0f} msg/s")
            rate = move(RABBIT_HTTP, RABBIT_AMQP, RABBIT_AMQP, rvh, n, size,
                        rabbit10.format(vhost=rvh), amqp10_src=rabbit10)
            print(f"AMQP 1.0 RabbitMQ -> RabbitMQ (its own amqp10 shovel): {rate:,.0f} msg/s")
        finally:
            call(RABBIT_HTTP, "DELETE", f"/api/vhosts/{rvh}")
    finally:
        own.stop()


if __name__ == "__main__":
    main()
