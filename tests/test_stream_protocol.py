"""RabbitMQ's stream protocol on ackmq (SPEC X1-X6), with rstream (unchanged) against a
real `ackmq serve`: publish with confirms, consume from first / offset / next / last,
credit, the same stream queues as AMQP 0-9-1 (pika both ways), deduplication by named
publisher across reconnects and kill -9, server-side offsets across kill -9, super
streams; and the response codes of the same calls side by side with RabbitMQ 3.10's
stream plugin (docs/stream-protocol.md)."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerProcess
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
    schema,
)
from rstream.encoding import decode_frame
from support.mgmthelp import Target
from support.streamraw import StreamPeer

RABBIT_STREAM_PORT = 5552


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("ackmq-stream"))
    b.start()
    assert b.stream_port, "no rabbitmq-stream:// URL in the broker's log line"
    yield b
    b.stop()


def _name(prefix: str = "xs") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def producer(port: int) -> Producer:
    return Producer("127.0.0.1", port=port, username="guest", password="guest")


async def consume(port: int, stream: str, n: int, spec: ConsumerOffsetSpecification,
                  decoder: Callable[[bytes], Any] | None = amqp_decoder,
                  timeout: float = 20.0) -> list[tuple[int, Any]]:
    """The first `n` messages (offset, message) from `spec` on."""
    got: list[tuple[int, Any]] = []
    done = asyncio.Event()

    async def on(msg: Any, ctx: MessageContext) -> None:
        got.append((ctx.offset, msg))
        if len(got) >= n:
            done.set()

    c = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await c.start()
    try:
        await c.subscribe(stream, on, decoder=decoder, offset_specification=spec)
        if n:
            await asyncio.wait_for(done.wait(), timeout)
        else:
            await asyncio.sleep(1.0)
    finally:
        await c.close()
    return got[:n] if n else got


def bodies(got: list[tuple[int, Any]]) -> list[bytes]:
    return [bytes(m.body) if not isinstance(m, bytes) else m for _o, m in got]


# -- X1: publish with confirms, consume --------------------------------------------------------
def test_X1_publish_confirm_then_consume_first_offset_next_last(broker: BrokerProcess) -> None:
    stream, port = _name(), broker.stream_port

    async def go() -> None:
        async with producer(port) as p:
            await p.create_stream(stream)
            confirmed: list[int] = []
            for i in range(20):
                await p.send_wait(stream, AMQPMessage(body=f"m{i}".encode()))
                confirmed.append(i)
            assert len(confirmed) == 20
        got = await consume(port, stream, 20, ConsumerOffsetSpecification(OffsetType.FIRST))
        assert bodies(got) == [f"m{i}".encode() for i in range(20)]
        assert [o for o, _m in got] == list(range(20))
        got = await consume(port, stream, 5,
                            ConsumerOffsetSpecification(OffsetType.OFFSET, 15))
        assert bodies(got) == [f"m{i}".encode() for i in range(15, 20)]
        # last: the newest chunk (the last publish, confirmed alone)
        got = await consume(port, stream, 1, ConsumerOffsetSpecification(OffsetType.LAST))
        assert bodies(got) == [b"m19"]

        async def later() -> None:
            await asyncio.sleep(1.5)
            async with producer(port) as p:
                await p.send_wait(stream, AMQPMessage(body=b"after"))
        task = asyncio.create_task(later())
        got = await consume(port, stream, 1, ConsumerOffsetSpecification(OffsetType.NEXT))
        await task
        assert bodies(got) == [b"after"] and got[0][0] == 20
    run(go())


def test_X1_batches_sub_entries_and_raw_payloads(broker: BrokerProcess) -> None:
    from rstream import CompressionType
    stream, port = _name(), broker.stream_port

    async def go() -> None:
        async with producer(port) as p:
            await p.create_stream(stream)
            await p.send_batch(stream, [AMQPMessage(body=f"b{i}".encode()) for i in range(50)])
            await p.send_sub_entry(stream, [AMQPMessage(body=f"s{i}".encode())
                                            for i in range(10)],
                                   compression_type=CompressionType.Gzip)
            await p.send_wait(stream, b"not an AMQP 1.0 message")
        # send_sub_entry's batch goes out from rstream's background task: by its order
        got = await consume(port, stream, 61, ConsumerOffsetSpecification(OffsetType.FIRST),
                            decoder=None)
        msgs = [m for _o, m in got]
        raw = [m for m in msgs if m == b"not an AMQP 1.0 message"]
        decoded = [bytes(amqp_decoder(m).body) for m in msgs if m not in raw]
        assert raw == [b"not an AMQP 1.0 message"]
        assert decoded[:50] == [f"b{i}".encode() for i in range(50)]
        assert decoded[50:] == [f"s{i}".encode() for i in range(10)]
    run(go())


def test_X1_credit_bounds_the_chunks_sent(broker: BrokerProcess) -> None:
    """Credit counts chunks: a subscription with credit 1 gets one Deliver, and the next
    only after a Credit."""
    stream, port = _name(), broker.stream_port
    peer = StreamPeer(port)
    try:
        assert peer.login() == 1
        assert peer.call(schema.Create(peer.next_corr(), stream=stream, arguments=[]),
                         schema.CreateResponse).response_code == 1
        assert peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1,
                                                 reference="", stream=stream),
                         schema.DeclarePublisherResponse).response_code == 1
        def publish(i: int) -> None:
            peer.send(schema.Publish(publisher_id=1, messages=[schema.Message(
                publishing_id=i, filter_value=None,
                data=bytes(AMQPMessage(body=f"c{i}".encode())))]))
            peer.wait(schema.PublishConfirm)

        publish(0)
        spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
        assert peer.call(schema.Subscribe(peer.next_corr(), subscription_id=3, stream=stream,
                                          offset_spec=spec, credit=1, properties=[]),
                         schema.SubscribeResponse).response_code == 1
        first = peer.wait(schema.Deliver)
        publish(1)  # its confirm comes; no Deliver: the one credit is spent
        assert not [e for e in peer.events if isinstance(e, schema.Deliver)]
        peer.sock.settimeout(1.5)
        with pytest.raises(TimeoutError):
            peer.wait(schema.Deliver)
        peer.sock.settimeout(10)
        peer.send(schema.Credit(subscription_id=3, credit=1))
        second = peer.wait(schema.Deliver)
        got = [bytes(amqp_decoder(m).body) for f in (first, second) for m in f.get_messages()]
        assert got == [b"c0", b"c1"]
        assert (first.chunk_first_offset, second.chunk_first_offset) == (0, 1)
    finally:
        peer.close()


# -- X2: the same stream queues as AMQP -------------------------------------------------------
def test_X2_rstream_publishes_pika_consumes_the_stream_queue(broker: BrokerProcess) -> None:
    stream, port = _name(), broker.stream_port

    async def pub() -> None:
        async with producer(port) as p:
            await p.create_stream(stream)
            for i in range(5):
                await p.send_wait(stream, AMQPMessage(
                    body=f"p{i}".encode(), application_properties={"n": str(i)}))
    run(pub())
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        got: list[tuple[bytes, dict[str, Any]]] = []
        ch.basic_consume(stream, lambda c, m, p, b: (got.append((b, p.headers or {})),
                                                     c.basic_ack(m.delivery_tag)),
                         arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            conn.process_data_events(0.2)
        assert [b for b, _h in got] == [f"p{i}".encode() for i in range(5)]
        assert [h.get("n") for _b, h in got] == [str(i).encode() for i in range(5)] or \
            [h.get("n") for _b, h in got] == [str(i) for i in range(5)]
        assert [h["x-stream-offset"] for _b, h in got] == list(range(5))
    finally:
        conn.close()


def test_X2_pika_publishes_rstream_consumes(broker: BrokerProcess) -> None:
    stream, port = _name(), broker.stream_port
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", stream, f"a{i}".encode(), pika.BasicProperties(
                delivery_mode=2, content_type="text/plain", headers={"k": i}))
    finally:
        conn.close()
    got = run(consume(port, stream, 5, ConsumerOffsetSpecification(OffsetType.FIRST)))
    assert bodies(got) == [f"a{i}".encode() for i in range(5)]
    m = got[0][1]
    assert m.properties.content_type in (b"text/plain", "text/plain")
    assert dict(m.application_properties) in ({b"k": 0}, {"k": 0})


# -- X3: deduplication by named publisher ------------------------------------------------------
async def _publish_named(port: int, stream: str, name: str, ids: range) -> None:
    peer = StreamPeer(port)
    try:
        assert peer.login() == 1
        assert peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1,
                                                 reference=name, stream=stream),
                         schema.DeclarePublisherResponse).response_code == 1
        peer.send(schema.Publish(publisher_id=1, messages=[schema.Message(
            publishing_id=i, filter_value=None,
            data=bytes(AMQPMessage(body=f"d{i}".encode()))) for i in ids]))
        confirmed: list[int] = []
        while len(confirmed) < len(ids):
            confirmed += peer.wait(schema.PublishConfirm).publishing_ids
        assert sorted(confirmed) == list(ids)
    finally:
        peer.close()


def _sequence(port: int, stream: str, name: str) -> int:
    peer = StreamPeer(port)
    try:
        assert peer.login() == 1
        r = peer.call(schema.QueryPublisherSequence(peer.next_corr(), publisher_ref=name,
                                                    stream=stream),
                      schema.QueryPublisherSequenceResponse)
        assert r.response_code == 1
        return int(r.sequence)
    finally:
        peer.close()


def test_X3_dedup_by_named_publisher_across_reconnect(broker: BrokerProcess) -> None:
    stream, port = _name(), broker.stream_port
    run(_create(port, stream))
    run(_publish_named(port, stream, "app-1", range(1, 11)))
    assert _sequence(port, stream, "app-1") == 10
    # a new connection resends 6..15: 6..10 are dropped (and confirmed), 11..15 kept
    run(_publish_named(port, stream, "app-1", range(6, 16)))
    assert _sequence(port, stream, "app-1") == 15
    got = run(consume(port, stream, 15, ConsumerOffsetSpecification(OffsetType.FIRST)))
    assert bodies(got) == [f"d{i}".encode() for i in range(1, 16)]
    assert run(consume(port, stream, 0, ConsumerOffsetSpecification(OffsetType.OFFSET, 15))) \
        == []


async def _create(port: int, stream: str) -> None:
    async with producer(port) as p:
        await p.create_stream(stream)


def test_X3_X4_dedup_and_stored_offsets_survive_kill_9(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        stream, port = _name(), b.stream_port
        run(_create(port, stream))
        run(_publish_named(port, stream, "app-k", range(0, 200)))
        peer = StreamPeer(port)
        assert peer.login() == 1
        peer.send(schema.StoreOffset(reference="reader-1", stream=stream, offset=123))
        # a query on the same connection comes after the store: it is in the tracking now
        assert peer.call(schema.QueryOffset(peer.next_corr(), reference="reader-1",
                                            stream=stream),
                         schema.QueryOffsetResponse).offset == 123
        time.sleep(0.5)  # StoreOffset has no answer: its write is the next turn's commit
        peer.close()
        b.kill()
        b.start()
        port = b.stream_port
        assert _sequence(port, stream, "app-k") == 199
        run(_publish_named(port, stream, "app-k", range(150, 210)))  # 150..199 dropped
        got = run(consume(port, stream, 210, ConsumerOffsetSpecification(OffsetType.FIRST)))
        assert bodies(got) == [f"d{i}".encode() for i in range(210)]
        peer = StreamPeer(port)
        try:
            assert peer.login() == 1
            r = peer.call(schema.QueryOffset(peer.next_corr(), reference="reader-1",
                                             stream=stream), schema.QueryOffsetResponse)
            assert (r.response_code, r.offset) == (1, 123)
        finally:
            peer.close()
    finally:
        b.stop()


# -- X5: super streams (RabbitMQ 3.11+: the protocol document is the reference) -----------------
def test_X5_super_stream_create_route_partitions_delete(broker: BrokerProcess) -> None:
    """CreateSuperStream / Route / Partitions / DeleteSuperStream arrived in RabbitMQ
    3.11-3.13; the reference is PROTOCOL.adoc and RabbitMQ's super stream docs: a direct
    exchange bound to one stream per partition, ordered by x-stream-partition-order."""
    name, port = _name("ss"), broker.stream_port
    parts = [f"{name}-{i}" for i in range(3)]
    peer = StreamPeer(port)
    try:
        assert peer.login() == 1
        r = peer.call(schema.CreateSuperStream(peer.next_corr(), super_stream=name,
                                               partitions=parts, binding_keys=["0", "1", "2"],
                                               arguments=[]),
                      schema.CreateSuperStreamResponse)
        assert r.response_code == 1
        r = peer.call(schema.SuperStreamPartitions(peer.next_corr(), super_stream=name),
                      schema.SuperStreamPartitionsResponse)
        assert r.streams == parts
        r = peer.call(schema.SuperStreamRoute(peer.next_corr(), routing_key="1",
                                              super_stream=name),
                      schema.SuperStreamRouteResponse)
        assert r.streams == [parts[1]]
        r = peer.call(schema.DeleteSuperStream(peer.next_corr(), super_stream=name),
                      schema.DeleteSuperStreamResponse)
        assert r.response_code == 1
        r = peer.call(schema.Metadata(peer.next_corr(), streams=parts),
                      schema.MetadataResponse)
        assert [m.response_code for m in r.metadata] == [2, 2, 2]
    finally:
        peer.close()


# -- X6 / X1: the same calls' answers as RabbitMQ 3.10's stream plugin ---------------------------
def _stream_port(mgmt: Target) -> int:
    return mgmt.server.stream_port if mgmt.kind == "ackmq" else RABBIT_STREAM_PORT


def test_X6_response_codes_as_rabbitmq(mgmt: Target) -> None:
    port = _stream_port(mgmt)
    stream = _name("cmp")
    peer = StreamPeer(port)
    codes: dict[str, int] = {}
    try:
        assert peer.login() == 1

        def code(label: str, frame: Any, reply: type) -> None:
            codes[label] = int(peer.call(frame, reply).response_code)

        code("create", schema.Create(peer.next_corr(), stream=stream, arguments=[
            schema.Property("max-length-bytes", "1000000"),
            schema.Property("max-age", "1h")]), schema.CreateResponse)
        code("create again", schema.Create(peer.next_corr(), stream=stream, arguments=[
            schema.Property("max-length-bytes", "1000000"),
            schema.Property("max-age", "1h")]), schema.CreateResponse)
        code("create again, other arguments", schema.Create(peer.next_corr(), stream=stream,
                                                            arguments=[]),
             schema.CreateResponse)
        code("create unknown argument", schema.Create(
            peer.next_corr(), stream=stream + "-u", arguments=[schema.Property("foo", "1")]),
             schema.CreateResponse)
        code("delete missing", schema.Delete(peer.next_corr(), stream=stream + "-nope"),
             schema.DeleteResponse)
        code("publisher on missing", schema.DeclarePublisher(
            peer.next_corr(), publisher_id=1, reference="", stream=stream + "-nope"),
             schema.DeclarePublisherResponse)
        code("publisher", schema.DeclarePublisher(
            peer.next_corr(), publisher_id=1, reference="r1", stream=stream),
             schema.DeclarePublisherResponse)
        code("publisher id again", schema.DeclarePublisher(
            peer.next_corr(), publisher_id=1, reference="r2", stream=stream),
             schema.DeclarePublisherResponse)
        code("publisher reference again", schema.DeclarePublisher(
            peer.next_corr(), publisher_id=2, reference="r1", stream=stream),
             schema.DeclarePublisherResponse)
        code("delete unknown publisher", schema.DeletePublisher(peer.next_corr(),
                                                                publisher_id=9),
             schema.DeletePublisherResponse)
        code("query sequence unknown", schema.QueryPublisherSequence(
            peer.next_corr(), publisher_ref="nobody", stream=stream),
             schema.QueryPublisherSequenceResponse)
        code("query sequence missing", schema.QueryPublisherSequence(
            peer.next_corr(), publisher_ref="nobody", stream=stream + "-nope"),
             schema.QueryPublisherSequenceResponse)
        code("query offset none", schema.QueryOffset(peer.next_corr(), reference="c",
                                                     stream=stream), schema.QueryOffsetResponse)
        code("query offset missing", schema.QueryOffset(
            peer.next_corr(), reference="c", stream=stream + "-nope"),
             schema.QueryOffsetResponse)
        spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
        code("subscribe missing", schema.Subscribe(
            peer.next_corr(), subscription_id=1, stream=stream + "-nope", offset_spec=spec,
            credit=1, properties=[]), schema.SubscribeResponse)
        code("subscribe", schema.Subscribe(peer.next_corr(), subscription_id=1, stream=stream,
                                           offset_spec=spec, credit=1, properties=[]),
             schema.SubscribeResponse)
        code("subscribe id again", schema.Subscribe(
            peer.next_corr(), subscription_id=1, stream=stream, offset_spec=spec, credit=1,
            properties=[]), schema.SubscribeResponse)
        code("unsubscribe unknown", schema.Unsubscribe(peer.next_corr(), subscription_id=7),
             schema.UnsubscribeResponse)
        peer.send(schema.Credit(subscription_id=7, credit=1))
        codes["credit unknown"] = int(peer.wait(schema.CreditResponse).response_code)
        peer.send(schema.Publish(publisher_id=9, messages=[schema.Message(
            publishing_id=5, filter_value=None, data=b"x")]))
        err = peer.wait(schema.PublishError)
        codes["publish unknown publisher"] = int(err.errors[0].response_code)
        r = peer.call(schema.Metadata(peer.next_corr(), streams=[stream + "-nope"]),
                      schema.MetadataResponse)
        codes["metadata missing"] = int(r.metadata[0].response_code)
        codes["metadata missing leader"] = int(r.metadata[0].leader_ref)
        r = peer.call(schema.Metadata(peer.next_corr(), streams=[stream]),
                      schema.MetadataResponse)
        codes["metadata"] = int(r.metadata[0].response_code)
        codes["metadata port"] = int(r.brokers[0].port) == port
        code("delete", schema.Delete(peer.next_corr(), stream=stream), schema.DeleteResponse)
        peer.call(schema.Delete(peer.next_corr(), stream=stream + "-u"), schema.DeleteResponse)
        code("close", schema.Close(peer.next_corr(), code=1, reason="bye"),
             schema.CloseResponse)
    finally:
        peer.close()
    # login and vhost refusals
    user, pw = mgmt.user(vhost=None)
    for label, args in (("bad password", ("guest", "wrong", "/")),
                        ("no such vhost", ("guest", "guest", "no-such-vhost-xs")),
                        ("vhost not permitted", (user, pw, "/"))):
        p = StreamPeer(port)
        try:
            codes[label] = p.login(*args)
        finally:
            p.close()
    assert codes == {
        "create": 1, "create again": 5, "create again, other arguments": 0x11,
        "create unknown argument": 1, "delete missing": 2,
        "publisher on missing": 2, "publisher": 1, "publisher id again": 0x11,
        "publisher reference again": 0x11, "delete unknown publisher": 0x12,
        "query sequence unknown": 1, "query sequence missing": 2, "query offset none": 0x13,
        "query offset missing": 2, "subscribe missing": 2, "subscribe": 1,
        "subscribe id again": 3, "unsubscribe unknown": 4, "credit unknown": 4,
        "publish unknown publisher": 0x12, "metadata missing": 2,
        "metadata missing leader": 0xFFFF, "metadata": 1, "metadata port": True,
        "delete": 1, "close": 1, "bad password": 8, "no such vhost": 0x0C,
        "vhost not permitted": 0x0C}, mgmt.kind


def test_X6_access_refused_as_rabbitmq(mgmt: Target) -> None:
    """A user with permissions on the vhost but none on the stream's name: create,
    declare publisher and subscribe are refused with ACCESS_REFUSED."""
    port = _stream_port(mgmt)
    stream = _name("acl")
    user, pw = mgmt.user(vhost=None)
    r = mgmt.call("PUT", f"/api/permissions/%2F/{user}",
                  {"configure": "^nothing$", "write": "^nothing$", "read": "^nothing$"})
    assert r.status in (201, 204)
    admin = StreamPeer(port)
    peer = StreamPeer(port)
    spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
    try:
        assert admin.login() == 1
        assert admin.call(schema.Create(admin.next_corr(), stream=stream, arguments=[]),
                          schema.CreateResponse).response_code == 1
        assert peer.login(user, pw) == 1
        got = [
            peer.call(schema.Create(peer.next_corr(), stream=stream + "-2", arguments=[]),
                      schema.CreateResponse).response_code,
            peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1, reference="",
                                              stream=stream),
                      schema.DeclarePublisherResponse).response_code,
            peer.call(schema.Subscribe(peer.next_corr(), subscription_id=1, stream=stream,
                                       offset_spec=spec, credit=1, properties=[]),
                      schema.SubscribeResponse).response_code,
            peer.call(schema.Delete(peer.next_corr(), stream=stream),
                      schema.DeleteResponse).response_code,
        ]
        assert got == [0x10, 0x10, 0x10, 0x10], mgmt.kind
    finally:
        admin.call(schema.Delete(admin.next_corr(), stream=stream), schema.DeleteResponse)
        admin.close()
        peer.close()


def test_X6_garbage_closes_only_that_connection(broker: BrokerProcess) -> None:
    port = broker.stream_port
    bad = StreamPeer(port)
    good = StreamPeer(port)
    try:
        assert good.login() == 1
        bad.send(b"\x00\x00\x00\x08\x7f\x00\x00\x01\x00\x00\x00\x01")  # an unknown key
        close = bad.wait(schema.Close)
        assert close.code == 0x0D
        bad.send(b"\x00\x00\x00\x04" + b"\xff" * 4 + b"\x00" * 64)
        assert good.call(schema.Metadata(good.next_corr(), streams=["x"]),
                         schema.MetadataResponse).metadata[0].response_code == 2
    finally:
        bad.close()
        good.close()
    assert not any("Traceback" in line for line in broker.log)


def test_X3_kill_9_during_confirmed_publishing_loses_nothing_confirmed(tmp_path: Path) -> None:
    """A named publisher sends windows of 50 with confirms; the broker is killed (-9)
    meanwhile. After the restart every confirmed id is in the stream, the publisher's
    stored sequence covers them, and resending everything from 0 adds no duplicate."""
    import threading
    b = BrokerProcess(tmp_path / "data")
    b.start()
    stream, port = _name("kill"), b.stream_port
    run(_create(port, stream))
    confirmed: list[int] = []

    def publish() -> None:
        peer = StreamPeer(port)
        try:
            assert peer.login() == 1
            peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1,
                                              reference="killed", stream=stream),
                      schema.DeclarePublisherResponse)
            for start in range(0, 1_000_000, 50):
                peer.send(schema.Publish(publisher_id=1, messages=[schema.Message(
                    publishing_id=i, filter_value=None,
                    data=bytes(AMQPMessage(body=f"k{i}".encode())))
                    for i in range(start, start + 50)]))
                got = 0
                while got < 50:
                    ids = peer.wait(schema.PublishConfirm).publishing_ids
                    confirmed.extend(ids)
                    got += len(ids)
        except (OSError, EOFError):
            pass  # the broker was killed
        finally:
            peer.close()

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while len(confirmed) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.kill()
    t.join(10)
    assert len(confirmed) >= 500
    try:
        b.start()
        port = b.stream_port
        seq = _sequence(port, stream, "killed")
        assert seq >= max(confirmed)
        # resend 0..seq+100: only what is above the stored sequence is taken
        run(_publish_named(port, stream, "killed", range(0, seq + 101)))
        peer = StreamPeer(port)
        try:
            assert peer.login() == 1
            r = peer.call(schema.Metadata(peer.next_corr(), streams=[stream]),
                          schema.MetadataResponse)
            assert r.metadata[0].response_code == 1
        finally:
            peer.close()
        got = run(consume(port, stream, seq + 101,
                          ConsumerOffsetSpecification(OffsetType.FIRST)))
        more = run(consume(port, stream, 0,
                           ConsumerOffsetSpecification(OffsetType.OFFSET, seq + 101)))
        ids = [int(b[1:]) for b in bodies(got) + bodies(more)]  # k<id> first, d<id> resent
        assert set(confirmed) <= set(ids)
        assert sorted(ids) == list(range(seq + 101))  # each once: no loss, no duplicate
    finally:
        b.stop()


def test_X5_single_active_consumer_hands_over_on_unsubscribe(broker: BrokerProcess) -> None:
    """Single active consumer for streams arrived in RabbitMQ 3.11 (the reference is the
    protocol document and RabbitMQ's blog post on it): the first subscription of a name
    is told it is active (ConsumerUpdate) and starts where its answer says; the second
    gets nothing until the first unsubscribes, then is told and starts where it says."""
    stream, port = _name("sac"), broker.stream_port
    run(_publish_named_stream(port, stream, 5))
    a, b = StreamPeer(port), StreamPeer(port)
    props = [schema.Property("single-active-consumer", "true"), schema.Property("name", "g")]
    spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
    try:
        for p in (a, b):
            assert p.login() == 1
            assert p.call(schema.Subscribe(p.next_corr(), subscription_id=1, stream=stream,
                                           offset_spec=spec, credit=10, properties=props),
                          schema.SubscribeResponse).response_code == 1
        up = a.wait(schema.ConsumerUpdateResponse)
        assert (up.subscription_id, up.active) == (1, 1)
        a.send(schema.ConsumerUpdateServerResponse(
            correlation_id=up.correlation_id, response_code=1,
            offset_specification=schema.OffsetSpecification(OffsetType.OFFSET, 2)))
        got = a.wait(schema.Deliver)
        assert got.chunk_first_offset == 2 and len(got.get_messages()) == 3
        run(_send(port, stream, b"g5"))  # appended: the active one gets it, the other not
        assert a.wait(schema.Deliver).chunk_first_offset == 5
        b.sock.settimeout(1.5)
        with pytest.raises(TimeoutError):
            b.wait(schema.ConsumerUpdateResponse)  # not active: told nothing, sent nothing
        assert not b.events
        b.sock.settimeout(10)
        assert a.call(schema.Unsubscribe(a.next_corr(), subscription_id=1),
                      schema.UnsubscribeResponse).response_code == 1
        up = b.wait(schema.ConsumerUpdateResponse)
        assert up.active == 1
        b.send(schema.ConsumerUpdateServerResponse(
            correlation_id=up.correlation_id, response_code=1,
            offset_specification=schema.OffsetSpecification(OffsetType.OFFSET, 4)))
        got = b.wait(schema.Deliver)
        assert got.chunk_first_offset == 4 and len(got.get_messages()) == 2
    finally:
        a.close()
        b.close()


def test_X5_super_stream_single_active_consumers_take_one_partition_each(
        broker: BrokerProcess) -> None:
    """rstream's own `test_consume_superstream_with_sac_*`: three SuperStreamConsumers of
    one name on a three-partition super stream get one partition each, as RabbitMQ 3.11+
    rebalances (super streams and single active consumer arrived in 3.11; the reference
    is RabbitMQ's documentation, "Single Active Consumer" with super streams, and its
    sac coordinator: the active member of a partition's group is the one at the
    partition's index modulo the group's size). The first consumer is told it is
    inactive on the partitions the later ones take over. Before: the first consumer kept
    all three, the others got nothing."""
    from rstream import EventContext, OffsetSpecification, SuperStreamConsumer

    name, port = _name("sacss"), broker.stream_port
    parts = [f"{name}-{i}" for i in range(3)]

    def super_stream(create: bool) -> None:
        peer = StreamPeer(port)
        try:
            assert peer.login() == 1
            frame: Any = schema.CreateSuperStream(
                peer.next_corr(), super_stream=name, partitions=parts,
                binding_keys=["k0", "k1", "k2"], arguments=[]) if create else \
                schema.DeleteSuperStream(peer.next_corr(), super_stream=name)
            reply = schema.CreateSuperStreamResponse if create else \
                schema.DeleteSuperStreamResponse
            assert peer.call(frame, reply).response_code == 1
        finally:
            peer.close()

    async def go() -> None:
        events: list[tuple[int, str, bool]] = []
        got: list[list[str]] = [[], [], []]
        consumers = [SuperStreamConsumer("127.0.0.1", port=port, username="guest",
                                         password="guest", super_stream=name)
                     for _ in range(3)]

        def listener(i: int) -> Callable[[bool, EventContext], Awaitable[Any]]:
            async def on_update(active: bool, ctx: EventContext) -> OffsetSpecification:
                events.append((i, ctx.stream, active))
                return OffsetSpecification(OffsetType.NEXT, 0)
            return on_update

        try:
            for i, c in enumerate(consumers):
                await c.start()
                await c.subscribe(
                    lambda m, ctx, i=i: got[i].append(ctx.stream), decoder=amqp_decoder,
                    properties={"single-active-consumer": "true", "name": "grp",
                                "super-stream": name},
                    consumer_update_listener=listener(i))
            want = {(0, parts[0], True), (1, parts[1], True), (2, parts[2], True),
                    (0, parts[1], False), (0, parts[2], False)}
            deadline = time.monotonic() + 20
            while not want <= set(events) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert want <= set(events), events
            async with producer(port) as p:
                for part in parts:
                    for k in range(5):
                        await p.send_wait(part, AMQPMessage(body=b"%d" % k))
            while sum(map(len, got)) < 15 and time.monotonic() < deadline + 10:
                await asyncio.sleep(0.1)
            assert got == [[parts[0]] * 5, [parts[1]] * 5, [parts[2]] * 5]
        finally:
            for c in consumers:
                await c.close()
    super_stream(True)
    try:
        run(go())
    finally:
        super_stream(False)


async def _publish_named_stream(port: int, stream: str, n: int) -> None:
    async with producer(port) as p:
        await p.create_stream(stream)
        await p.send_batch(stream, [AMQPMessage(body=f"g{i}".encode()) for i in range(n)])


async def _send(port: int, stream: str, body: bytes) -> None:
    async with producer(port) as p:
        await p.send_wait(stream, AMQPMessage(body=body))


def test_X1_stream_connections_are_listed_by_the_management_api(ackmq_mgmt: Any) -> None:
    """RabbitMQ lists stream connections with protocol `stream`; ackmq's views show them
    beside the others (a listing with a stream client connected must not fail)."""
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    peer = StreamPeer(ackmq_mgmt.stream_port)
    try:
        assert peer.login() == 1
        deadline = time.monotonic() + 10
        while True:
            r = t.call("GET", "/api/connections")
            assert r.status == 200
            if any(c.get("protocol") == "stream" for c in r.body) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.2)
        (c,) = [c for c in r.body if c.get("protocol") == "stream"]
        assert (c["user"], c["vhost"]) == ("guest", "/")
        for path in ("/api/overview", "/api/channels", "/api/consumers", "/metrics"):
            assert t.call("GET", path).status == 200
    finally:
        peer.close()


def test_X5_filtering_sends_only_what_the_filter_asks_for(broker: BrokerProcess) -> None:
    """Stream filtering arrived in RabbitMQ 3.13 (its documentation and the protocol
    document are the reference): Publish v2 carries a filter value per message, a
    subscription's `filter.N` properties select them (`match-unfiltered` adds those
    without one); what goes out is a superset the client filters further. ackmq sends the
    stretch from the first to the last wanted message of what it reads at once. The
    value is the header `x-stream-filter-value` for AMQP consumers (RabbitMQ 4's name)."""
    from rstream import FilterConfiguration
    stream, port = _name("flt"), broker.stream_port

    async def go() -> list[tuple[int, Any]]:
        values = iter(["b"] * 10 + ["a"] * 10 + ["b"] * 10)

        async def extract(_msg: AMQPMessage) -> str:
            return next(values)

        async with Producer("127.0.0.1", port=port, username="guest", password="guest",
                            filter_value_extractor=extract) as p:
            await p.create_stream(stream)
            for i in range(30):
                await p.send_wait(stream, AMQPMessage(body=f"f{i}".encode()))
        got: list[tuple[int, Any]] = []

        async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
            got.append((ctx.offset, msg))

        c = Consumer("127.0.0.1", port=port, username="guest", password="guest")
        await c.start()
        await c.subscribe(stream, on, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                          filter_input=FilterConfiguration(values_to_filter=["a"]))
        await asyncio.sleep(2.0)
        await c.close()
        return got

    got = run(go())
    assert bodies(got) == [f"f{i}".encode() for i in range(10, 20)]
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        seen: list[Any] = []
        ch.basic_consume(stream, lambda c, m, p, b: (seen.append(p.headers or {}),
                                                     c.basic_ack(m.delivery_tag)),
                         arguments={"x-stream-offset": 10})
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            conn.process_data_events(0.2)
        assert seen[0]["x-stream-filter-value"] in (b"a", "a")
    finally:
        conn.close()


def test_X1_stream_deleted_under_its_readers_and_publishers(mgmt: Target) -> None:
    """Deleted over AMQP while a stream client publishes to it and reads it: that client
    gets MetadataUpdate STREAM_NOT_AVAILABLE (0x06); its publisher and subscription are
    gone (a later Publish: PublishError 0x12), the connection stays. Both brokers."""
    stream, port = _name("del"), _stream_port(mgmt)
    run(_create(port, stream))
    peer = StreamPeer(port)
    spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
    try:
        assert peer.login() == 1
        assert peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1,
                                                 reference="", stream=stream),
                         schema.DeclarePublisherResponse).response_code == 1
        assert peer.call(schema.Subscribe(peer.next_corr(), subscription_id=1, stream=stream,
                                          offset_spec=spec, credit=5, properties=[]),
                         schema.SubscribeResponse).response_code == 1
        conn = pika.BlockingConnection(pika.URLParameters(mgmt.amqp_url))
        try:
            conn.channel().queue_delete(stream)
        finally:
            conn.close()
        up = peer.wait(schema.MetadataUpdate)
        assert (up.metadata_info.code, up.metadata_info.stream) == (0x06, stream)
        peer.send(schema.Publish(publisher_id=1, messages=[schema.Message(
            publishing_id=1, filter_value=None, data=b"x")]))
        assert peer.wait(schema.PublishError).errors[0].response_code == 0x12
        assert peer.call(schema.Unsubscribe(peer.next_corr(), subscription_id=1),
                         schema.UnsubscribeResponse).response_code == 0x04
    finally:
        peer.close()


def test_X1_the_stream_listener_in_overview_and_health_checks(mgmt: Target) -> None:
    """/api/overview lists the `stream` listener with its port and the protocol-listener
    health check finds it, as RabbitMQ with its stream plugin."""
    port = _stream_port(mgmt)
    r = mgmt.call("GET", "/api/overview")
    assert r.status == 200
    assert [x["port"] for x in r.body["listeners"] if x["protocol"] == "stream"] == [port]
    r = mgmt.call("GET", "/api/health/checks/protocol-listener/stream")
    assert (r.status, r.body) == (200, {"status": "ok", "protocol": "stream"})


def test_X1_last_is_the_newest_chunk_not_a_whole_large_batch(mgmt: Target) -> None:
    """rstream's own `test_offset_type_last`: 4,999 messages sent with one `send_batch`,
    then a consumer from `last` gets the newest chunk: fewer than all of them, ending
    with the last. RabbitMQ's chunks hold what its writer took at once; ackmq's are the
    Delivers it builds, at most 256 records, so `last` starts at most 256 records before
    the end of the newest batch (before: the whole batch written in one loop turn)."""
    port = _stream_port(mgmt)
    stream = _name("last")

    async def go() -> None:
        async with producer(port) as p:
            await p.create_stream(stream)
            try:
                await p.send_batch(stream, [AMQPMessage(body=b"%d" % i)
                                            for i in range(1, 5000)])
                got: list[bytes] = []
                done = asyncio.Event()

                async def on(msg: Any, ctx: MessageContext) -> None:
                    got.append(bytes(msg.body))
                    if got[-1] == b"4999":
                        done.set()

                c = Consumer("127.0.0.1", port=port, username="guest", password="guest")
                await c.start()
                try:
                    await c.subscribe(stream, on, decoder=amqp_decoder,
                                      offset_specification=ConsumerOffsetSpecification(
                                          OffsetType.LAST))
                    await asyncio.wait_for(done.wait(), 30)
                finally:
                    await c.close()
                assert 0 < len(got) < 4999 and got[-1] == b"4999"
                assert got == [b"%d" % i for i in range(5000 - len(got), 5000)]
            finally:
                await p.delete_stream(stream)
    run(go())


def test_X1_deliver_v2_carries_the_committed_chunk_id_when_the_client_asks(
        broker: BrokerProcess) -> None:
    """Deliver v2 (RabbitMQ 3.13+: the protocol document, PROTOCOL.adoc in
    rabbitmq-server's deps/rabbitmq_stream, is the reference; RabbitMQ 3.10 has no
    ExchangeCommandVersions): ExchangeCommandVersions offers Deliver 1-2 (and Publish
    1-2), in key order; a client that lists Deliver 2 gets Deliver v2 from then on — a
    u64 committed chunk id between the subscription id and the chunk: the first offset
    of the newest chunk (where `last` starts, StreamStats' committed_chunk_id), at least
    the Deliver's own first offset; the chunk after it is the v1 chunk, byte for byte
    (rstream decodes it). A raw client that never asks, and rstream (which exchanges
    Publish only), get v1."""
    stream, port = _name("v2"), broker.stream_port
    n = 600
    peer, plain = StreamPeer(port), StreamPeer(port)
    try:
        assert peer.login() == 1 and plain.login() == 1
        assert peer.call(schema.Create(peer.next_corr(), stream=stream, arguments=[]),
                         schema.CreateResponse).response_code == 1
        assert peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1,
                                                 reference="", stream=stream),
                         schema.DeclarePublisherResponse).response_code == 1
        peer.send(schema.Publish(publisher_id=1, messages=[schema.Message(
            publishing_id=i, filter_value=None, data=bytes(AMQPMessage(body=b"%d" % i)))
            for i in range(n)]))  # one frame: one batch written together
        confirmed = 0
        while confirmed < n:
            confirmed += len(peer.wait(schema.PublishConfirm).publishing_ids)
        r = peer.call(schema.ExchangeCommandVersionRequest(
            peer.next_corr(), command_versions=[schema.FrameHandlerInfo(8, 1, 2)]),
            schema.ExchangeCommandVersionResponse)
        versions = {v.key_command: (v.min_version, v.max_version) for v in r.command_versions}
        assert r.response_code == 1
        assert [v.key_command for v in r.command_versions] == sorted(versions)
        assert versions[8] == (1, 2) and versions[2] == (1, 2) and versions[7] == (1, 1)

        def subscribe(p: StreamPeer, sub: int, kind: OffsetType, **props: str) -> None:
            assert p.call(schema.Subscribe(
                p.next_corr(), subscription_id=sub, stream=stream,
                offset_spec=schema.OffsetSpec.from_params(kind, None), credit=50,
                properties=[schema.Property(k.replace("_", "-"), v)
                            for k, v in props.items()]),
                schema.SubscribeResponse).response_code == 1

        def delivers(p: StreamPeer, upto: int) -> list[tuple[int, int | None, Any]]:
            """(version, committed chunk id, rstream's v1 Deliver) until offset `upto`."""
            out: list[tuple[int, int | None, Any]] = []
            while not out or out[-1][2].chunk_first_offset + \
                    out[-1][2].num_entries - 1 < upto:
                raw = p.read_raw()
                key, version = struct.unpack_from(">HH", raw)
                if key != 8:
                    continue
                cid = struct.unpack_from(">Q", raw, 5)[0] if version == 2 else None
                v1 = raw[:2] + b"\0\1" + raw[4:5] + (raw[13:] if version == 2 else raw[5:])
                out.append((version, cid, decode_frame(v1)))
            return out

        subscribe(peer, 2, OffsetType.LAST)  # the newest chunk
        (v, committed, d), = delivers(peer, n - 1)
        assert v == 2 and committed == d.chunk_first_offset and 0 < committed < n
        subscribe(peer, 1, OffsetType.FIRST)
        got = delivers(peer, n - 1)
        assert {v for v, _c, _d in got} == {2}
        for _v, cid, d in got:
            assert cid == max(committed, d.chunk_first_offset)
        assert [bytes(amqp_decoder(m).body) for _v, _c, d in got for m in d.get_messages()] \
            == [b"%d" % i for i in range(n)]
        # a filtered subscription's chunks (built record by record) are v2 as well
        subscribe(peer, 3, OffsetType.FIRST, **{"filter.0": "x", "match_unfiltered": "true"})
        got = delivers(peer, n - 1)
        assert {v for v, _c, _d in got} == {2}
        assert [c for _v, c, _d in got] == [max(committed, d.chunk_first_offset)
                                           for _v, _c, d in got]
        assert sum(d.num_entries for _v, _c, d in got) == n

        subscribe(plain, 1, OffsetType.FIRST)
        assert {v for v, _c, _d in delivers(plain, n - 1)} == {1}
    finally:
        peer.close()
        plain.close()
    got_rstream = run(consume(port, stream, n, ConsumerOffsetSpecification(OffsetType.FIRST)))
    assert bodies(got_rstream) == [b"%d" % i for i in range(n)]
