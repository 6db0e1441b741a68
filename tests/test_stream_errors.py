"""RabbitMQ's stream error counters (SPEC X6): `rabbitmq_global_stream_error_<name>_total
{protocol="stream"}` on /metrics, one per response code, counted where the front end
answers a command with that code. The same calls against RabbitMQ 3.10.8's stream plugin
(its Prometheus endpoint on 15692) and ackmq give the same increments: one per refused
command (a Publish frame of an unknown publisher counts once, whatever its messages), the
Close of an unknown frame counted (not a frame too large: rabbit_stream_reader closes
for it without counting), the MetadataUpdate telling a connection with a
publisher on a deleted stream counted as stream_not_available, nothing counted for QueryOffset's "no offset",
Metadata of a missing stream or the opening's refusals (bad password, vhost, mechanism),
which RabbitMQ 3.10 does not count."""

from __future__ import annotations

import contextlib
import re
import struct
import uuid
from typing import Any

from rstream import OffsetType, schema
from support.mgmthelp import Target
from support.streamraw import StreamPeer

RABBIT_STREAM_PORT = 5552
RABBIT_PROMETHEUS = "http://127.0.0.1:15692"
COUNTER = re.compile(r'^rabbitmq_global_stream_error_(\w+)_total\{protocol="stream"\} (\S+)$',
                     re.M)


def _counters(mgmt: Target) -> dict[str, float]:
    t = mgmt if mgmt.kind == "ackmq" else Target("rabbitmq", RABBIT_PROMETHEUS, "")
    r = t.call("GET", "/metrics")
    assert r.status == 200
    return {m.group(1): float(m.group(2)) for m in COUNTER.finditer(r.raw.decode())}


def _steps(port: int, stream: str) -> list[tuple[str, Any]]:
    """(label, call) pairs, each call one refused (or accepted) command."""
    p = StreamPeer(port)
    assert p.login() == 1
    spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)

    def call(frame: Any, reply: type) -> Any:
        return lambda: p.call(frame, reply)

    def send(frame: Any, reply: type) -> Any:
        def go() -> None:
            p.send(frame)
            p.wait(reply)
        return go

    def garbage() -> None:
        q = StreamPeer(port)
        try:
            assert q.login() == 1
            q.send(b"\x00\x00\x00\x08\x7f\x7f\x00\x01\x00\x00\x00\x00")
            assert q.wait(schema.Close).code == 0x0D
        finally:
            q.close()

    def login(user: str, password: str, vhost: str) -> Any:
        def go() -> None:
            q = StreamPeer(port)
            try:
                assert q.login(user, password, vhost) != 1
            finally:
                q.close()
        return go

    def too_large() -> None:
        q = StreamPeer(port)
        try:
            assert q.login() == 1
            n = 1048576 + 100  # above the frame max both brokers tune (1 MiB)
            q.send(struct.pack(">I", n) + b"\x00\x0d\x00\x01" + bytes(n - 4))
            with contextlib.suppress(EOFError, OSError):  # RabbitMQ 3.10 may just close
                q.wait(schema.Close)
        finally:
            q.close()

    missing = stream + "-nope"
    return [
        ("create", call(schema.Create(p.next_corr(), stream=stream, arguments=[]),
                        schema.CreateResponse)),
        ("create again", call(schema.Create(p.next_corr(), stream=stream, arguments=[]),
                              schema.CreateResponse)),
        ("delete missing", call(schema.Delete(p.next_corr(), stream=missing),
                                schema.DeleteResponse)),
        ("publisher on missing", call(schema.DeclarePublisher(
            p.next_corr(), publisher_id=1, reference="", stream=missing),
            schema.DeclarePublisherResponse)),
        ("publisher", call(schema.DeclarePublisher(p.next_corr(), publisher_id=1,
                                                   reference="r", stream=stream),
                           schema.DeclarePublisherResponse)),
        ("publisher id again", call(schema.DeclarePublisher(
            p.next_corr(), publisher_id=1, reference="r2", stream=stream),
            schema.DeclarePublisherResponse)),
        ("delete unknown publisher", call(schema.DeletePublisher(p.next_corr(),
                                                                 publisher_id=9),
                                          schema.DeletePublisherResponse)),
        ("query sequence missing", call(schema.QueryPublisherSequence(
            p.next_corr(), publisher_ref="x", stream=missing),
            schema.QueryPublisherSequenceResponse)),
        ("query offset none", call(schema.QueryOffset(p.next_corr(), reference="c",
                                                      stream=stream),
                                   schema.QueryOffsetResponse)),
        ("subscribe missing", call(schema.Subscribe(
            p.next_corr(), subscription_id=1, stream=missing, offset_spec=spec, credit=1,
            properties=[]), schema.SubscribeResponse)),
        ("subscribe", call(schema.Subscribe(p.next_corr(), subscription_id=1, stream=stream,
                                            offset_spec=spec, credit=1, properties=[]),
                           schema.SubscribeResponse)),
        ("subscribe id again", call(schema.Subscribe(
            p.next_corr(), subscription_id=1, stream=stream, offset_spec=spec, credit=1,
            properties=[]), schema.SubscribeResponse)),
        ("unsubscribe unknown", call(schema.Unsubscribe(p.next_corr(), subscription_id=7),
                                     schema.UnsubscribeResponse)),
        ("credit unknown", send(schema.Credit(subscription_id=7, credit=1),
                                schema.CreditResponse)),
        ("publish 3 with an unknown publisher", send(schema.Publish(
            publisher_id=9, messages=[schema.Message(publishing_id=i, filter_value=None,
                                                     data=b"x") for i in range(3)]),
            schema.PublishError)),
        ("metadata missing", call(schema.Metadata(p.next_corr(), streams=[missing]),
                                  schema.MetadataResponse)),
        ("unsubscribe", call(schema.Unsubscribe(p.next_corr(), subscription_id=1),
                             schema.UnsubscribeResponse)),
        ("delete", call(schema.Delete(p.next_corr(), stream=stream), schema.DeleteResponse)),
        ("unknown frame", garbage),
        ("frame too large", too_large),
        ("bad password", login("guest", "wrong", "/")),
        ("no such vhost", login("guest", "guest", "no-such-vhost-xe")),
        ("close", lambda: p.close()),
    ]


def test_X6_stream_error_counters_as_rabbitmq(mgmt: Target) -> None:
    port = mgmt.server.stream_port if mgmt.kind == "ackmq" else RABBIT_STREAM_PORT
    names = set(_counters(mgmt))
    assert len(names) == 17, names  # every code RabbitMQ 3.10 counts, there from the start
    got: dict[str, dict[str, float]] = {}
    for label, step in _steps(port, f"xe-{uuid.uuid4().hex[:8]}"):
        before = _counters(mgmt)
        step()
        after = _counters(mgmt)
        got[label] = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert got == {
        "create": {}, "create again": {"stream_already_exists": 1},
        "delete missing": {"stream_does_not_exist": 1},
        "publisher on missing": {"stream_does_not_exist": 1}, "publisher": {},
        "publisher id again": {"precondition_failed": 1},
        "delete unknown publisher": {"publisher_does_not_exist": 1},
        "query sequence missing": {"stream_does_not_exist": 1}, "query offset none": {},
        "subscribe missing": {"stream_does_not_exist": 1}, "subscribe": {},
        "subscribe id again": {"subscription_id_already_exists": 1},
        "unsubscribe unknown": {"subscription_id_does_not_exist": 1},
        "credit unknown": {"subscription_id_does_not_exist": 1},
        "publish 3 with an unknown publisher": {"publisher_does_not_exist": 1},
        "metadata missing": {}, "unsubscribe": {},
        # the connection's publisher is told the stream went (MetadataUpdate 0x06)
        "delete": {"stream_not_available": 1},
        "unknown frame": {"unknown_frame": 1}, "frame too large": {}, "bad password": {}, "no such vhost": {},
        "close": {}}, mgmt.kind


def test_X6_answer_code_reads_the_code_of_every_answer_and_of_nothing_else() -> None:
    """In process: the front end counts errors from the answers it wrote
    (frames.answer_code), so the code must be found in each answer's layout (Credit's
    has no correlation id) and not in frames that carry none."""
    from ackmq.protocol.stream import constants as K
    from ackmq.protocol.stream import frames as F
    assert F.answer_code(F.response(K.SUBSCRIBE, 7, K.STREAM_DOES_NOT_EXIST)) == 0x02
    assert F.answer_code(F.u64_response(K.QUERY_OFFSET, 7, K.NO_OFFSET, 0)) == 0x13
    assert F.answer_code(F.credit_response(K.SUBSCRIPTION_ID_DOES_NOT_EXIST, 3)) == 0x04
    assert F.answer_code(F.response(K.DELETE, 1, K.OK)) == K.OK
    assert F.answer_code(F.publish_confirm(1, [1, 2])) is None
    assert F.answer_code(F.metadata_update(K.STREAM_NOT_AVAILABLE, "s")) is None
    assert F.answer_code(F.heartbeat()) is None
    assert F.answer_code(b"") is None
    assert set(K.ERROR_NAMES) == set(range(0x02, 0x13))  # every code but OK, NO_OFFSET
