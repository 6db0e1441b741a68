"""R4, the AMQP side of the Spark stream source (no JVM): offset probes and range reads
against ackmq and RabbitMQ's streams, and what happens on a queue that is not a stream."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
import uuid

import pika
import pytest

pytest.importorskip("pyarrow", reason="the Spark connector needs pyarrow (extra 'spark')")

from support import streamhelp  # noqa: E402
from support.net import listening  # noqa: E402
from support.streamhelp import publish  # noqa: E402

from ackmq.spark.amqp import ConsumerError  # noqa: E402
from ackmq.spark.streamwire import (  # noqa: E402
    first_offset,
    last_offset,
    offset_at,
    read_range,
)

stream_url = streamhelp.stream_url  # fixtures: ackmq and RabbitMQ, skipped without streams
stream = streamhelp.stream


def _offsets(url: str, name: str, start: int, end: int) -> list[tuple[int, bytes]]:
    return [(d.offset, d.body) for batch in read_range(url, name, start, end, prefetch=64,
                                                       rows=100) for d in batch]


def test_R4_probes_of_an_empty_stream(stream_url: str, stream: str) -> None:
    assert first_offset(stream_url, stream) is None
    assert last_offset(stream_url, stream) is None


def test_R4_first_last_and_ranges(stream_url: str, stream: str) -> None:
    publish(stream_url, stream, [b"%d" % i for i in range(1000)])
    first, last = first_offset(stream_url, stream), last_offset(stream_url, stream)
    assert first == 0 and last is not None and last >= 999
    everything = _offsets(stream_url, stream, 0, last + 1)
    assert [b for _, b in everything] == [b"%d" % i for i in range(1000)]
    offs = [o for o, _ in everything]
    assert offs == sorted(set(offs)) and offs[-1] == last
    # any split into ranges reads every message exactly once, in order
    cuts = [0, 1, 137, 500, 501, 999, last + 1]
    parts = [m for a, b in zip(cuts, cuts[1:], strict=False)
             for m in _offsets(stream_url, stream, a, b)]
    assert parts == everything
    # reading a range twice gives the same messages (R3); a range starting mid-chunk
    # holds no earlier offset
    assert _offsets(stream_url, stream, 250, 260) == _offsets(stream_url, stream, 250, 260)
    assert [o for o, _ in _offsets(stream_url, stream, 250, 260)] == \
        [o for o in offs if 250 <= o < 260]


def test_R4_offset_at_a_timestamp(stream_url: str, stream: str) -> None:
    publish(stream_url, stream, [b"old"])
    time.sleep(2.1)  # AMQP timestamps have seconds: leave a whole second between
    when = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=0.5)
    time.sleep(0.6)
    publish(stream_url, stream, [b"new-0", b"new-1"])
    at = offset_at(stream_url, stream, when)
    assert at is not None
    assert [b for _, b in _offsets(stream_url, stream, at, last_offset(stream_url, stream) + 1)
            ] == [b"new-0", b"new-1"]
    assert offset_at(stream_url, stream, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)) \
        is None


def test_R4_a_classic_queue_is_refused_and_keeps_its_messages(stream_url: str) -> None:
    name = f"spark.classic.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    try:
        publish(stream_url, name, [b"keep-me"])
        with pytest.raises(ConsumerError, match="x-stream-offset|not a stream"):
            list(read_range(stream_url, name, 0, 10))
        deadline = time.monotonic() + 10
        while ch.queue_declare(name, passive=True).method.message_count != 1 \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ch.queue_declare(name, passive=True).method.message_count == 1
    finally:
        ch.queue_delete(name)
        conn.close()


def test_R4_missing_stream_fails_with_404(stream_url: str) -> None:
    with pytest.raises(ConsumerError, match="404 NOT_FOUND - no queue 'spark.nosuch"):
        first_offset(stream_url, "spark.nosuch.stream")


def test_R4_cli_refuses_a_missing_stream_and_a_classic_queue(stream_url: str,
                                                             tmp_path) -> None:
    """`pipeline land --stream` checks before Spark starts: one line, exit 1; a classic
    queue keeps its message."""
    import subprocess
    import sys

    name = f"spark.classic.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    try:
        publish(stream_url, name, [b"keep-me"])
        for target, expect in (("spark.nosuch.stream", "404 NOT_FOUND - no queue"),
                               (name, "x-stream-offset")):
            p = subprocess.run(
                [sys.executable, "-m", "ackmq", "pipeline", "land", "--url", stream_url,
                 "--stream", target, "--to", str(tmp_path / "lake"),
                 "--checkpoint", str(tmp_path / "chk")],
                capture_output=True, text=True, timeout=60)
            lines = p.stderr.strip().splitlines()
            assert p.returncode == 1 and len(lines) == 1, p.stderr
            assert lines[0].startswith("ackmq pipeline land: ") and expect in lines[0], lines
        time.sleep(0.5)
        assert ch.queue_declare(name, passive=True).method.message_count == 1
    finally:
        ch.queue_delete(name)
        conn.close()


def test_X2_R4_ranges_over_the_stream_protocol_equal_the_amqp_reads(stream_url: str,
                                                                    stream: str) -> None:
    """The read tasks' stream-protocol reader (RabbitMQ's binary protocol, chunks decoded
    by protocol/stream) gives every column the AMQP 0-9-1 reader gives: RabbitMQ 3.10
    keeps what AMQP 1.0 has no place for as x-basic-* annotations and application
    properties, ackmq in the header and properties sections; both come back as the 0-9-1
    properties. Any split reads every message once; a start inside a chunk holds no
    earlier offset; the range ends at end - 1."""
    from ackmq.spark import streamproto

    surl = streamhelp.stream_protocol_url(stream_url)
    publish(stream_url, stream, [b"p%d" % i for i in range(3)], content_type="text/plain",
            app_id="app", message_id="m1", correlation_id="c", reply_to="r",
            message_type="t", priority=3, expiration="60000", timestamp=1700000000,
            headers={"h": 1, "x-k": "v", "s": "str"})
    publish(stream_url, stream, [b"%d" % i for i in range(1500)])
    last = last_offset(stream_url, stream)
    assert last is not None

    def row(d: object) -> tuple[object, ...]:
        m = d.method  # type: ignore[attr-defined]
        return (d.offset, d.body, m.exchange, m.routing_key, d.props,  # type: ignore[attr-defined]
                d.headers)  # type: ignore[attr-defined]

    def over_stream(a: int, b: int) -> list[tuple[object, ...]]:
        return [row(d) for batch in streamproto.read_range(surl, stream, a, b,
                                                           amqp_url=stream_url, rows=100)
                for d in batch]

    amqp = [row(d) for batch in read_range(stream_url, stream, 0, last + 1, prefetch=500)
            for d in batch]
    assert len(amqp) == 1503 and amqp[0][4][:4] == ("text/plain", None, 2, 3)
    assert over_stream(0, last + 1) == amqp
    cuts = [0, 1, 2, 3, 137, 700, 701, last, last + 1]
    assert [m for a, b in zip(cuts, cuts[1:], strict=False) for m in over_stream(a, b)] == amqp
    with pytest.raises(ConsumerError, match="Subscribe answered 0x02 STREAM_DOES_NOT_EXIST"):
        list(streamproto.read_range(surl, "spark.nosuch.stream", 0, 10, amqp_url=stream_url))


def test_R4_protocol_option_picks_the_read_tasks_protocol(
        stream_url: str, stream: str, caplog: pytest.LogCaptureFixture) -> None:
    """`protocol` stream (with `streamUrl`) reads over the stream protocol: a URL where
    nothing listens fails the read, where the AMQP path would not look; a bad value is
    refused by name."""

    from ackmq.spark.stream_source import AckmqStreamBatchReader, StreamRange

    publish(stream_url, stream, [b"x"])
    base = {"url": stream_url, "stream": stream}
    with pytest.raises(ValueError, match="protocol must be one of stream, amqp, got 'mqtt'"):
        AckmqStreamBatchReader({**base, "protocol": "mqtt"})
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a port nothing listens on
    dead = AckmqStreamBatchReader({**base, "protocol": "stream",
                                   "streamUrl": f"rabbitmq-stream://127.0.0.1:{port}/"})
    with pytest.raises(ConsumerError, match=f"cannot reach the stream protocol at "
                       f"rabbitmq-stream://127.0.0.1:{port}/: ConnectionRefusedError"):
        list(dead.read(StreamRange(0, 1)))
    surl = streamhelp.stream_protocol_url(stream_url)
    ok = AckmqStreamBatchReader({**base, "protocol": "stream", "streamUrl": surl})
    assert [b.num_rows for b in ok.read(StreamRange(0, 1))] == [1]
    # unset: the stream protocol where it answers for this broker and stream, decided
    # when planning and carried by the partitions; else AMQP, with a warning saying why
    planned = AckmqStreamBatchReader({**base, "streamUrl": surl}).partitions()
    assert {p.protocol for p in planned} == {"stream"}  # type: ignore[attr-defined]
    cases = [(f"rabbitmq-stream://127.0.0.1:{port}/", "ConnectionRefusedError"),
             (surl + "nosuchvhost", "vhost 'nosuchvhost' refused")]
    if ":5672/" not in stream_url and listening(("127.0.0.1", 5552)):
        # ackmq: RabbitMQ's plugin on 5552 (when it is there) is another broker
        cases.append(("rabbitmq-stream://guest:guest@127.0.0.1:5552/",
                      "is 'RabbitMQ', the AMQP broker 'ackmq'"))
    for url, why in cases:
        with caplog.at_level(logging.WARNING, logger="ackmq.spark.stream"):
            planned = AckmqStreamBatchReader({**base, "streamUrl": url}).partitions()
        assert {p.protocol for p in planned} == {"amqp"}  # type: ignore[attr-defined]
        assert why in caplog.records[-1].getMessage()
        assert [b.num_rows for b in AckmqStreamBatchReader({**base, "streamUrl": url})
                .read(planned[0])] == [1]


def test_R4_X1_amqps_url_gives_the_stream_protocol_over_tls() -> None:
    """The stream-protocol reader's URL for an AMQP url: amqps:// reads over the stream
    protocol's TLS listener (RabbitMQ's rabbitmq-stream+tls://, 5551 by default) with the
    url's TLS options and none of its other ones; a given +tls streamUrl without options
    takes the url's; TLS options on a plain stream URL, or unknown ones, are refused."""
    from ackmq.spark.stream_source import _StreamOptions
    from ackmq.spark.streamproto import stream_url_for, tls_of, with_tls_of

    amqps = ("amqps://u:p@broker.example/vh?cacertfile=/c/ca.pem&certfile=/c/me.pem"
             "&keyfile=/c/me.key&server_name_indication=mq&heartbeat=5")
    tls = "cacertfile=/c/ca.pem&certfile=/c/me.pem&keyfile=/c/me.key&server_name_indication=mq"
    assert stream_url_for(amqps) == f"rabbitmq-stream+tls://u:p@broker.example:5551/vh?{tls}"
    assert stream_url_for("amqp://u:p@h/vh?heartbeat=5") == "rabbitmq-stream://u:p@h:5552/vh"
    opts = tls_of(stream_url_for(amqps))
    assert opts is not None and (opts.cacertfile, opts.certfile, opts.keyfile,
                                 opts.server_name_indication) == \
        ("/c/ca.pem", "/c/me.pem", "/c/me.key", "mq")
    assert tls_of("rabbitmq-stream://h:1/") is None
    given = "rabbitmq-stream+tls://u:p@h:7000/vh"
    assert with_tls_of(given, amqps) == f"{given}?{tls}"
    assert with_tls_of(given + "?verify=verify_none", amqps) == given + "?verify=verify_none"
    assert _StreamOptions({"url": amqps, "stream": "s", "streamUrl": given}).stream_url == \
        f"{given}?{tls}"
    assert _StreamOptions({"url": amqps, "stream": "s"}).stream_url == stream_url_for(amqps)
    with pytest.raises(ValueError, match="need a rabbitmq-stream\\+tls:// URL"):
        _StreamOptions({"url": amqps, "stream": "s",
                        "streamUrl": "rabbitmq-stream://h:5552/?cacertfile=/c/ca.pem"})
    with pytest.raises(ValueError, match="unknown stream URL option"):
        tls_of("rabbitmq-stream+tls://h/?heartbeat=5")
