"""Seed sessions and mutation tables of the listener fuzzer (fuzz_listeners.py): one
valid client session per listener, as a list of frames, with the bytes that mean
something in that protocol.

Names a session creates come from a small fixed set (`slot`), so a mutation that
breaks a delete leaks nothing that grows with the run: 10^6 mutated frames must not
turn into 10^5 queues or vhosts whose cost would drown what is measured.
"""

from __future__ import annotations

import base64
import json
import random

from ackmq.protocol.amqp import PROTOCOL_HEADER
from tools.robustness.fuzz import KINDS, mutate

SLOTS = 16
_AUTH = b"Authorization: Basic " + base64.b64encode(b"guest:guest") + b"\r\n"


def slot(tag: str) -> int:
    return int(tag, 16) % SLOTS


# ---- MQTT -------------------------------------------------------------------------------

MQTT_SPECIAL = (b"\x00", b"\xff", b"\x80", b"\x7f", b"\xff\xff\xff\x7f", b"\x00\x00",
                b"\x30\x00", b"\x36", b"\x62\x02\x00\x01", b"\xc0\x00", b"\xe0\x00",
                b"\x10", b"\x23\x00\x01", b"\x26", b"#", b"+", b"$share/", b"\x00\x00\x00")


def mqtt_session(tag: str) -> list[bytes]:
    """Connect (5.0 or 3.1.1, a persistent session on half the slots, a will), subscribe
    (a wildcard, a shared group, a subscription id), publish at QoS 0, 1 and 2 (retained,
    a topic alias, user properties), PUBREL, ack a delivery, ping, unsubscribe,
    disconnect. Client ids, topics and retained topics come from `slot`."""
    from ackmq.protocol.mqtt import (
        Connect,
        Disconnect,
        PingReq,
        PubAck,
        Publish,
        PubRel,
        SubOptions,
        Subscribe,
        Unsubscribe,
        Will,
        encode,
    )
    n = slot(tag)
    level = 5 if n % 2 else 4
    props5 = level == 5
    t = f"fz/{n}"
    packets = [
        Connect(f"fz-{n}", level, n % 4 < 2, 30, Will(f"{t}/will", b"w", 1, False,
                                                       {"will_delay_interval": 1} if props5
                                                       else {}),
                "guest", b"guest", {"session_expiry_interval": 5} if props5 else {}),
        Subscribe(1, [(f"{t}/#", SubOptions(2)), (f"$share/g{n}/{t}/s", SubOptions(1))],
                  {"subscription_identifier": [n + 1]} if props5 else {}),
        Publish(f"{t}/a", b"qos0", 0),
        Publish(f"{t}/b", b"qos1" * 10, 1, True, False, 2,
                {"topic_alias": 1, "user_property": [("k", tag)]} if props5 else {}),
        Publish(f"{t}/c", b"qos2", 2, False, False, 3),
        PubRel(3), PubAck(1), PingReq(),
        Publish(f"{t}/b", b"", 1, True, False, 4),
        Unsubscribe(5, [f"{t}/#"]), Disconnect()]
    return [encode(p, level) for p in packets]


# ---- STOMP ------------------------------------------------------------------------------

STOMP_SPECIAL = (b"\x00", b"\n", b"\r", b"\r\n", b"\\", b":", b"\\c", b"\xff", b"\n\n",
                 b"content-length:99999999\n", b"content-length:-1\n", b"content-length:\n",
                 b"transaction:t1\n", b"ACK\nid:x@@y@@1\n\n\x00",
                 b"NACK\nid:T_s1@@y@@2\nrequeue:false\n\n\x00", b"SEND\n\n\x00",
                 b"STOMP\n\n\x00", b"CONNECT\n\n\x00", b"heart-beat:1,1\n",
                 b"ack:client-individual\n", b"prefetch-count:0\n", b"x-max-length:1\n")


def stomp_session(tag: str) -> list[bytes]:
    """Connect, subscribe (exchange-bound exclusive queue, a shared queue, a
    temp-queue reply), send with and without content-length, escapes, a transaction
    committed and one aborted, unsubscribe, heart-beat EOLs, disconnect."""
    n = slot(tag)
    x = f"/exchange/amq.direct/fz.{tag}"
    return [
        b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nlogin:guest\npasscode:guest\n"
        b"heart-beat:0,0\n\n\x00",
        f"SUBSCRIBE\ndestination:{x}\nid:s1\nack:client\nprefetch-count:5\n"
        f"receipt:sub\n\n\x00".encode(),
        f"SUBSCRIBE\ndestination:/queue/fzs.{n}\nid:s2\nack:auto\n\n\x00".encode(),
        f"SEND\ndestination:{x}\npersistent:true\nreceipt:r1\nk\\cey:v\\nal\n"
        f"content-length:5\n\nhello\x00".encode(),
        f"SEND\ndestination:/queue/fzs.{n}\npersistent:true\nreply-to:/temp-queue/r\n"
        f"content-type:text/plain\n\nno length\x00".encode(),
        f"SEND\ndestination:/topic/fz.{tag}\ncontent-type:text/plain\n\nto a topic\x00"
        .encode(),
        b"BEGIN\ntransaction:t1\n\n\x00",
        f"SEND\ndestination:{x}\ntransaction:t1\n\ntx body\x00".encode(),
        b"COMMIT\ntransaction:t1\nreceipt:c\n\n\x00",
        b"BEGIN\ntransaction:t2\n\n\x00",
        f"SEND\ndestination:{x}\ntransaction:t2\n\naborted\x00".encode(),
        b"ABORT\ntransaction:t2\n\n\x00",
        b"UNSUBSCRIBE\nid:s1\n\n\x00",
        b"\n\n",
        b"DISCONNECT\nreceipt:bye\n\n\x00",
    ]


# ---- HTTP (the management API) -------------------------------------------------------------

HTTP_SPECIAL = (b"\r\n", b"\r\n\r\n", b"\n", b"\x00", b"Content-Length: 99999999999\r\n",
                b"Content-Length: -1\r\n", b"Transfer-Encoding: chunked\r\n",
                b"Authorization: Basic !!!\r\n", b"Authorization: Bearer x\r\n",
                b"Expect: 100-continue\r\n", b"Connection: close\r\n", b"{", b"}", b"\"",
                b"\\u0000", b"[", b"null", b"1e999", b"%", b"%2F", b"%ff", b"..", b"/",
                b"HTTP/1.0", b"HTTP/2.0", b"ffffffff\r\n", b"0\r\n\r\n", b"\xff\xfe")


def _req(method: str, path: str, body: object | None = None, auth: bytes = _AUTH,
         extra: bytes = b"") -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + auth + extra
    if body is not None:
        head += b"Content-Type: application/json\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(data) + data


def http_session(tag: str) -> list[bytes]:
    """Pipelined keep-alive requests: overview, declare a queue (x-expires, so a
    broken delete leaks nothing), bind, publish, get, list, bad credentials,
    delete; the last asks to close."""
    q = f"fzh.{slot(tag)}"
    return [
        _req("GET", "/api/overview"),
        _req("PUT", f"/api/queues/%2F/{q}", {"durable": False, "auto_delete": False,
                                              "arguments": {"x-expires": 30000,
                                                            "x-max-length": 100}}),
        _req("POST", f"/api/bindings/%2F/e/amq.topic/q/{q}",
             {"routing_key": "a.#", "arguments": {"k": [1, "x", None]}}),
        _req("POST", "/api/exchanges/%2F/amq.default/publish",
             {"properties": {"delivery_mode": 2, "headers": {"a": 1, "b": {"c": True}},
                             "priority": 3}, "routing_key": q,
              "payload": "aGVsbG8=", "payload_encoding": "base64"}),
        _req("POST", f"/api/queues/%2F/{q}/get",
             {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto",
              "truncate": 50000}),
        _req("GET", f"/api/queues/%2F/{q}?lengths_age=60&lengths_incr=5"),
        _req("GET", "/api/queues?page=1&page_size=5&name=fz&use_regex=false"),
        _req("GET", "/api/whoami", auth=b"Authorization: Basic Z3Vlc3Q6d3Jvbmc=\r\n"),
        _req("GET", "/api/users", auth=b""),
        _req("PUT", f"/api/permissions/%2F/nobody.{tag}",
             {"configure": ".*", "write": ".*", "read": "("}),
        _req("DELETE", f"/api/queues/%2F/{q}/contents"),
        _req("DELETE", f"/api/queues/%2F/{q}?if-unused=true"),
        _req("GET", "/api/vhosts", extra=b"Connection: close\r\n"),
    ]


# ---- the admin socket (JSON lines) -------------------------------------------------------

ADMIN_SPECIAL = (b"\n", b"\x00", b"{", b"}", b"[", b"]", b"\"", b"\\", b"\\u0000",
                 b"\\ud800", b"null", b"1e999", b"NaN", b"-0", b"[[[[[[[[[[",
                 b"\"args\":", b"\"vhost\":", b"\xff\xfe", b",", b":")


def _line(verb: str, *args: str, vhost: str | None = None, **more: object) -> bytes:
    req: dict[str, object] = {"verb": verb, "args": list(args), **more}
    if vhost is not None:
        req["vhost"] = vhost
    return json.dumps(req).encode() + b"\n"


def admin_session(tag: str) -> list[bytes]:
    """rabbitmqctl's verbs as `ackmq ctl` sends them, on a vhost and a user of a
    small fixed set (fz.N; a mutated delete leaves at most SLOTS of each)."""
    v, u = f"fz.{slot(tag)}", f"fzuser.{slot(tag)}"
    return [
        _line("list_users"),
        _line("add_vhost", v),
        _line("add_user", u, "secret"),
        _line("set_user_tags", u, "monitoring", "policymaker"),
        _line("set_permissions", u, "^fz", ".*", ".*", vhost=v),
        _line("set_topic_permissions", u, "amq.topic", "^a", ".*", vhost=v),
        _line("list_permissions", vhost=v),
        _line("list_user_permissions", u),
        _line("set_vhost_limits", '{"max-connections": 10, "max-queues": -1}', vhost=v),
        _line("list_vhost_limits", vhost=v),
        _line("list_items", "queues", "name", "messages"),
        _line("list_items", "connections"),
        _line("node_status"),
        _line("alarms"),
        _line("import_definitions", definitions={"queues": [
            {"name": "fz.def", "vhost": v, "durable": True, "auto_delete": False,
             "arguments": {"x-max-length": 1}}], "bindings": []}),
        _line("delete_queue", "fz.def", vhost=v),
        _line("clear_permissions", u, vhost=v),
        _line("delete_user", u),
        _line("delete_vhost", v),
    ]


# ---- TLS --------------------------------------------------------------------------------

TLS_SPECIAL = (b"\x16\x03\x01", b"\x16\x03\x03\xff\xff", b"\x15\x03\x03\x00\x02\x02\x28",
               b"\x14\x03\x03\x00\x01\x01", b"\x17\x03\x03\x40\x00", b"\x00\x00",
               b"\xff\xff", b"\x00\x2b\x00\x03\x02\x03\x04", b"\x00\x00\x00\x00",
               PROTOCOL_HEADER)


# ---- mutation -----------------------------------------------------------------------------

def random_ops(rnd: random.Random, special: tuple[bytes, ...], text: bool
               ) -> list[tuple[str, float, int, bytes]]:
    """1-3 byte operations (fuzz.mutate's), inserting the protocol's special bytes
    more often than random ones; in text protocols sometimes a long run (limits)."""
    ops = []
    for _ in range(rnd.randint(1, 3)):
        r = rnd.random()
        if text and r < 0.08:
            blob = bytes([rnd.choice(b"a:\\\n ,\"")]) * rnd.choice((100, 9000, 70000))
        elif r < 0.65:
            blob = rnd.choice(special)
        else:
            blob = rnd.randbytes(rnd.randint(1, 8))
        ops.append((rnd.choice(KINDS), rnd.random(), rnd.getrandbits(32), blob))
    return ops


def mutate_frames(frames: list[bytes], rnd: random.Random, special: tuple[bytes, ...],
                  text: bool, mean: float = 4.0) -> tuple[bytes, int]:
    """fuzz.mutate_session for any protocol: (bytes, frames mutated)."""
    out = list(frames)
    count = min(len(out), max(1, int(rnd.expovariate(1 / mean)) + 1))
    for i in sorted(rnd.sample(range(len(out)), count), reverse=True):
        r = rnd.random()
        if r < 0.05:
            out[i] = b""
        elif r < 0.10:
            out[i] = out[i] * rnd.randint(2, 4)
        elif r < 0.14 and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
        elif r < 0.16:
            out[i] = rnd.randbytes(rnd.randint(1, 64))
        else:
            out[i] = mutate(out[i], random_ops(rnd, special, text))
    return b"".join(out), count


# ---- AMQP 1.0 (on the AMQP port) ------------------------------------------------------------

AMQP10_SPECIAL = (b"\x00", b"\xff", b"\x40", b"\x45", b"\x00\x53\x10", b"\x00\x53\x99",
                  b"\xd0\xff\xff\xff\xff\x00\x00\x00\x01", b"\xc0\x00\x00", b"\xa1\xff",
                  b"\xb1\x7f\xff\xff\xff", b"\xe0\x02\x01\x40", b"AMQP\x00\x01\x00\x00",
                  b"AMQP\x03\x01\x00\x00", b"\x00\x00\x00\x08\x02\x00\x00\x00",
                  b"\xff\xff\xff\xff\x02\x00\x00\x00", b"\x00\x00\x00\x08\x00\x00\x00\x00")


def amqp10_session(tag: str) -> list[bytes]:
    """SASL PLAIN, open, a session, a sender link (durable transfers, one in two frames),
    a receiver link (credit, drain, each outcome), detach, end, close; one frame each."""
    from ackmq.protocol.amqp10 import AMQP_HEADER, SASL_HEADER, Composite, encode_frame
    from ackmq.protocol.amqp10 import frames as F
    from ackmq.protocol.amqp10.message import DATA, Message10
    from ackmq.protocol.amqp10.types import UInt
    n = slot(tag)
    q = f"/queue/fz10.{n}"

    def body(text: str) -> bytes:
        return Message10(header=Composite("header", durable=True),
                         application_properties={"tag": tag},
                         body=[(DATA, text.encode())]).encode()

    def transfer(did: int, payload: bytes, more: bool = False, settled: bool = False) -> bytes:
        return encode_frame(1, Composite("transfer", handle=UInt(0), delivery_id=UInt(did),
                                         delivery_tag=bytes([did]), message_format=UInt(0),
                                         more=more, settled=settled or None), payload)

    two = body("split " + tag)
    flow = dict(next_incoming_id=UInt(0), incoming_window=UInt(1000),
                next_outgoing_id=UInt(3), outgoing_window=UInt(1000))
    out = [
        SASL_HEADER,
        encode_frame(0, Composite("sasl_init", mechanism="PLAIN",
                                  initial_response=b"\0guest\0guest"), b"", F.SASL_FRAME),
        AMQP_HEADER,
        encode_frame(0, Composite("open", container_id=f"fz-{tag}", hostname="vhost:/",
                                  idle_time_out=UInt(0))),
        encode_frame(1, Composite("begin", next_outgoing_id=UInt(0),
                                  incoming_window=UInt(1000), outgoing_window=UInt(1000))),
        encode_frame(1, Composite("attach", name="s", handle=UInt(0), role=False,
                                  source=Composite("source"),
                                  target=Composite("target", address=q),
                                  initial_delivery_count=UInt(0))),
        transfer(0, body("one " + tag)),
        transfer(1, two[:10], more=True),
        transfer(1, two[10:]),
        transfer(2, body("presettled"), settled=True),
        encode_frame(1, Composite("attach", name="r", handle=UInt(1), role=True,
                                  source=Composite("source", address=q),
                                  target=Composite("target"))),
        encode_frame(1, Composite("flow", handle=UInt(1), delivery_count=UInt(0),
                                  link_credit=UInt(3), **flow)),
        encode_frame(1, Composite("disposition", role=True, first=UInt(0), last=UInt(0),
                                  settled=True, state=Composite("accepted"))),
        encode_frame(1, Composite("disposition", role=True, first=UInt(1), settled=True,
                                  state=Composite("modified", delivery_failed=True))),
        encode_frame(1, Composite("disposition", role=True, first=UInt(2), settled=True,
                                  state=Composite("released"))),
        encode_frame(1, Composite("flow", handle=UInt(1), delivery_count=UInt(3),
                                  link_credit=UInt(5), drain=True, **flow)),
        encode_frame(1, Composite("detach", handle=UInt(1), closed=True)),
        encode_frame(1, Composite("detach", handle=UInt(0), closed=True)),
        encode_frame(1, Composite("end")),
        encode_frame(0, Composite("close")),
    ]
    return out


# ---- RabbitMQ's stream protocol ------------------------------------------------------------

STREAM_SPECIAL = (b"\x00", b"\xff", b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00",
                  b"\x00\x00\x00\x00", b"\x00\x00\x00\x04", b"\xff\xff", b"\x00\x0d",
                  b"\x00\x00\x00\x08\x00\x02\x00\x01", b"\x00\x10\x00\x00\x00\x02",
                  b"\x80", b"\x90\x00\x01", b"\xa0")


def stream_session(tag: str) -> list[bytes]:
    """Peer properties, SASL PLAIN, tune (heartbeat 1 s), open, create a stream, a named
    publisher, publishes (simple, a sub-entry batch, raw bytes), a subscription with
    credit, store/query offset, metadata, stats, unsubscribe, delete, close; one frame
    each."""
    import struct

    from ackmq.protocol.amqp10 import Composite
    from ackmq.protocol.amqp10.message import DATA, Message10
    from ackmq.protocol.stream import constants as K
    from ackmq.protocol.stream.frames import frame

    name = f"fzs.{slot(tag)}"

    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack(">H", len(b)) + b

    def u32(x: int) -> bytes:
        return struct.pack(">I", x)

    def msg(text: str) -> bytes:
        return Message10(header=Composite("header", durable=True),
                         application_properties={"tag": tag},
                         body=[(DATA, text.encode())]).encode()

    def entry(pid: int, data: bytes) -> bytes:
        return struct.pack(">Q", pid) + u32(len(data)) + data

    batch = b"".join(u32(len(m)) + m for m in (msg("s1"), msg("s2")))
    sub_entry = (struct.pack(">Q", 9) + bytes((0x80,)) + struct.pack(">H", 2)
                 + u32(len(batch)) + u32(len(batch)) + batch)
    return [
        frame(K.PEER_PROPERTIES, 1, u32(1) + u32(1) + s("product") + s("fuzz")),
        frame(K.SASL_HANDSHAKE, 1, u32(2)),
        frame(K.SASL_AUTHENTICATE, 1, u32(3) + s("PLAIN") + u32(12) + b"\0guest\0guest"),
        frame(K.TUNE, 1, u32(65536) + u32(1)),
        frame(K.OPEN, 1, u32(4) + s("/")),
        frame(K.CREATE, 1, u32(5) + s(name) + u32(1) + s("max-length-bytes") + s("1000000")),
        frame(K.DECLARE_PUBLISHER, 1, u32(6) + b"\x01" + s(f"p{tag}") + s(name)),
        frame(K.PUBLISH, 1, b"\x01" + u32(2) + entry(1, msg("one " + tag))
              + entry(2, b"raw " + tag.encode())),
        frame(K.PUBLISH, 1, b"\x01" + u32(1) + sub_entry),
        frame(K.QUERY_PUBLISHER_SEQUENCE, 1, u32(7) + s(f"p{tag}") + s(name)),
        frame(K.SUBSCRIBE, 1, u32(8) + b"\x02" + s(name) + struct.pack(">HH", 1, 2)
              + u32(1) + s("name") + s("c")),
        frame(K.CREDIT, 1, b"\x02" + struct.pack(">H", 3)),
        frame(K.STORE_OFFSET, 1, s("c") + s(name) + struct.pack(">Q", 1)),
        frame(K.QUERY_OFFSET, 1, u32(9) + s("c") + s(name)),
        frame(K.METADATA, 1, u32(10) + u32(2) + s(name) + s("nope")),
        frame(K.STREAM_STATS, 1, u32(11) + s(name)),
        frame(K.HEARTBEAT, 1, b""),
        frame(K.UNSUBSCRIBE, 1, u32(12) + b"\x02"),
        frame(K.DELETE_PUBLISHER, 1, u32(13) + b"\x01"),
        frame(K.CLOSE, 1, u32(14) + struct.pack(">H", 1) + s("bye")),
    ]
