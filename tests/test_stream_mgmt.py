"""The stream protocol's operations surface (SPEC X1): RabbitMQ's stream management
plugin's `/api/stream/connections`, `/api/stream/publishers`, `/api/stream/consumers`
(all, per vhost, publishers per stream) and rabbitmq-streams' `list_stream_connections`,
`list_stream_consumers`, `list_stream_publishers` through `ackmq ctl`, over the admin
socket and over the HTTP API (`--url`), with a real rstream publisher and consumer on a
real `ackmq serve`. The reference broker here runs without `rabbitmq_stream_management`
(RabbitMQ 3.10's plugin set), so the JSON fields and the verbs' default columns follow
that plugin's and rabbitmq_stream's sources (rabbit_stream_metrics.erl,
rabbit_stream_mgmt_db.erl, rabbit_stream.hrl's *_INFO_ITEMS)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BrokerProcess
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from support.mgmthelp import Target

from ackmq.cli import main

HTTP_URL = re.compile(r"http://\S+?:(\d+)")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("ackmq-stream-mgmt") / "data")
    b.start()
    assert b.stream_port
    yield b
    b.stop()


def http_base(b: BrokerProcess) -> str:
    m = HTTP_URL.search("".join(b.log))
    assert m, b.log
    return f"http://127.0.0.1:{m.group(1)}"


def get(b: BrokerProcess, path: str) -> Any:
    r = Target("ackmq", http_base(b), "").call("GET", path)
    assert r.status == 200, (path, r.status, r.body)
    return r.body


def ctl(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ctl", *args])
    r = subprocess.CompletedProcess(["ctl", *args], code, out.getvalue(), err.getvalue())
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


async def _session(b: BrokerProcess, stream: str, check: Any) -> None:
    """A named publisher that published and had 5 confirmed, a subscription that got
    them, both open while `check` runs (in a thread: it makes blocking calls)."""
    port = b.stream_port
    p = Producer("127.0.0.1", port=port, username="guest", password="guest")
    await p.start()
    await p.create_stream(stream)
    got: list[bytes] = []
    c = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await c.start()
    try:
        for i in range(5):
            await p.send_wait(stream, AMQPMessage(body=f"m{i}".encode()))

        async def on(msg: bytes, _ctx: Any) -> None:
            got.append(msg)

        await c.subscribe(stream, on, offset_specification=ConsumerOffsetSpecification(
            OffsetType.FIRST), initial_credit=7, properties={"name": "app-1"})
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(got) == 5
        await asyncio.to_thread(check)
    finally:
        await c.close()
        await p.delete_stream(stream, missing_ok=True)
        await p.close()


def _run(b: BrokerProcess, check: Any) -> None:
    asyncio.run(asyncio.wait_for(_session(b, f"xm-{uuid.uuid4().hex[:8]}", check), 90))


def test_X1_api_stream_connections_publishers_consumers(broker: BrokerProcess) -> None:
    """/api/stream/connections lists the stream connections only (as /api/connections
    with their publisher and consumer counts); /api/stream/publishers and
    /api/stream/consumers list each one with the plugin's fields."""
    def check() -> None:
        stream = get(broker, "/api/stream/publishers")[0]["queue"]
        conns = get(broker, "/api/stream/connections")
        assert conns and all(c["protocol"] == "stream" for c in conns)
        assert len(get(broker, "/api/stream/connections/%2F")) == len(conns)
        # (rstream's Producer opens a connection of its own beside the stream's leader's)
        assert sum(c["publishers"] for c in conns) == 1
        assert sum(c["consumers"] for c in conns) == 1
        (pub,) = get(broker, "/api/stream/publishers/%2F")
        assert pub["queue"] == stream and stream["vhost"] == "/"
        assert (pub["published"], pub["confirmed"], pub["errored"]) == (5, 5, 0)
        assert set(pub) >= {"publisher_id", "reference", "connection_details"}
        assert pub["connection_details"]["user"] == "guest"
        assert set(pub["connection_details"]) == {"name", "user", "node", "peer_host",
                                                  "peer_port"}
        assert get(broker, f"/api/stream/publishers/%2F/{stream['name']}") == [pub]
        assert get(broker, "/api/stream/publishers/%2F/no-such-stream") == []
        (con,) = get(broker, "/api/stream/consumers")
        assert con["queue"] == stream
        assert (con["consumed"], con["offset"], con["offset_lag"]) == (5, 5, 0)
        assert con["properties"]["name"] == "app-1"
        assert isinstance(con["credits"], int) and isinstance(con["subscription_id"], int)
        assert con["connection_details"]["name"] in {c["name"] for c in conns}
        assert get(broker, "/api/connections") != []
    _run(broker, check)
    assert get(broker, "/api/stream/consumers") == []
    assert get(broker, "/api/stream/publishers") == []


def _metric(b: BrokerProcess, name: str) -> float:
    r = Target("ackmq", http_base(b), "").call("GET", "/metrics")
    assert r.status == 200
    text = r.raw.decode()
    m = re.search(rf'^{name}{{protocol="stream"}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_X1_metrics_count_stream_publishers_and_consumers(broker: BrokerProcess) -> None:
    """rabbitmq_global_publishers / _consumers{protocol="stream"} count the declared
    publishers and the subscriptions, as RabbitMQ's stream plugin does (a subscription
    reads the log: it is no model consumer)."""
    seen: list[float] = []

    def check() -> None:
        seen.extend((_metric(broker, "rabbitmq_global_publishers"),
                     _metric(broker, "rabbitmq_global_consumers")))
    _run(broker, check)
    assert seen == [1.0, 1.0]
    assert _metric(broker, "rabbitmq_global_consumers") == 0.0


def test_X1_ctl_list_stream_verbs_socket_and_url(broker: BrokerProcess) -> None:
    """rabbitmq-streams' verbs with their default columns, the same rows over the admin
    socket and over the HTTP API."""
    def check() -> None:
        for how in (("--data-dir", str(broker.data_dir)),
                    ("--url", http_base(broker).replace("http://", "http://guest:guest@"))):
            out = ctl(*how, "list_stream_publishers").splitlines()
            assert out[0] == "Listing stream publishers ..."
            assert out[1].split("\t") == ["publisher_id", "stream", "reference",
                                          "messages_published", "messages_confirmed",
                                          "messages_errored"]
            row = out[2].split("\t")
            assert row[1].startswith("xm-") and row[3:] == ["5", "5", "0"]
            out = ctl(*how, "list_stream_consumers").splitlines()
            assert out[1].split("\t") == ["connection_pid", "subscription_id", "stream",
                                          "messages_consumed", "offset", "offset_lag",
                                          "credits", "properties"]
            row = out[2].split("\t")
            assert row[2].startswith("xm-") and row[3:6] == ["5", "5", "0"]
            out = ctl(*how, "list_stream_connections").splitlines()
            assert out[:2] == ["Listing stream connections ...", "conn_name"]
            assert len(out) >= 4 and all("->" in line for line in out[2:])
            rows = json.loads(ctl(*how, "list_stream_connections", "user", "vhost",
                                  "subscriptions", "--formatter", "json"))
            assert sum(r["subscriptions"] for r in rows) == 1
            assert {(r["user"], r["vhost"]) for r in rows} == {("guest", "/")}
            assert ctl(*how, "list_stream_publishers", "-p", "/",
                       "stream").splitlines()[2].startswith("xm-")
    _run(broker, check)
