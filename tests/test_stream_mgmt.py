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
from urllib.parse import quote

import pytest
from conftest import BrokerProcess
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    schema,
)
from support.mgmthelp import Target
from support.streamraw import StreamPeer

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


def _ctl_fails(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ctl", *args])
    return code, out.getvalue(), err.getvalue()


def _ways(b: BrokerProcess) -> list[tuple[str, ...]]:
    return [("--data-dir", str(b.data_dir)),
            ("--url", http_base(b).replace("http://", "http://guest:guest@"))]


def test_X5_ctl_list_stream_group_consumers_socket_and_url(broker: BrokerProcess) -> None:
    """rabbitmq-streams list_stream_group_consumers (RabbitMQ 3.11+, so its CLI command
    and man page are the reference): a single active consumer group's members, the
    active one first, `subscription_id connection_name state`; a group that is not
    there: "The group does not exist"."""
    port = broker.stream_port
    stream = f"xg-{uuid.uuid4().hex[:8]}"
    admin, a, b = StreamPeer(port), StreamPeer(port), StreamPeer(port)
    props = [schema.Property("single-active-consumer", "true"), schema.Property("name", "grp")]
    spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
    try:
        assert admin.login() == 1
        assert admin.call(schema.Create(admin.next_corr(), stream=stream, arguments=[]),
                          schema.CreateResponse).response_code == 1
        for sid, p in ((3, a), (4, b)):
            assert p.login() == 1
            assert p.call(schema.Subscribe(p.next_corr(), subscription_id=sid, stream=stream,
                                           offset_spec=spec, credit=1, properties=props),
                          schema.SubscribeResponse).response_code == 1
        up = a.wait(schema.ConsumerUpdateResponse)
        a.send(schema.ConsumerUpdateServerResponse(
            correlation_id=up.correlation_id, response_code=1,
            offset_specification=schema.OffsetSpecification(OffsetType.FIRST, 0)))
        names = {c["name"] for c in get(broker, "/api/stream/connections")}
        for how in _ways(broker):
            out = ctl(*how, "list_stream_group_consumers", "--stream", stream,
                      "--reference", "grp").splitlines()
            assert out[:2] == ["Listing group consumers ...",
                               "subscription_id\tconnection_name\tstate"]
            rows = [line.split("\t") for line in out[2:]]
            assert [(r[0], r[2]) for r in rows] == [("3", "active"), ("4", "inactive")]
            assert {r[1] for r in rows} <= names and rows[0][1] != rows[1][1]
            out = ctl(*how, "list_stream_group_consumers", "--stream", stream,
                      "--reference", "grp", "state", "-p", "/").splitlines()
            assert out[1:] == ["state", "active", "inactive"]
            code, _, err = _ctl_fails(*how, "list_stream_group_consumers", "--stream", stream,
                                      "--reference", "nobody")
            assert (code, err) == (70, "Error:\nThe group does not exist\n")
    finally:
        for p in (a, b):
            p.close()
        admin.call(schema.Delete(admin.next_corr(), stream=stream), schema.DeleteResponse)
        admin.close()


def test_X3_X4_ctl_list_stream_tracking_socket_and_url(broker: BrokerProcess) -> None:
    """rabbitmq-streams list_stream_tracking STREAM [--all|--offset|--writer] (RabbitMQ
    3.11+: its CLI command is the reference): `type name tracking_value` rows, a named
    publisher's last publishing id as `writer`, a consumer's stored offset as `offset`;
    a stream that is not there: "The stream does not exist."."""
    port = broker.stream_port
    stream = f"xt-{uuid.uuid4().hex[:8]}"
    p = StreamPeer(port)
    try:
        assert p.login() == 1
        assert p.call(schema.Create(p.next_corr(), stream=stream, arguments=[]),
                      schema.CreateResponse).response_code == 1
        assert p.call(schema.DeclarePublisher(p.next_corr(), publisher_id=1, reference="w1",
                                              stream=stream),
                      schema.DeclarePublisherResponse).response_code == 1
        p.send(schema.Publish(publisher_id=1, messages=[schema.Message(
            publishing_id=i, filter_value=None, data=bytes(AMQPMessage(body=b"t")))
            for i in (5, 6, 7)]))
        confirmed: list[int] = []
        while len(confirmed) < 3:
            confirmed += p.wait(schema.PublishConfirm).publishing_ids
        p.send(schema.StoreOffset(reference="c1", stream=stream, offset=2))
        assert p.call(schema.QueryOffset(p.next_corr(), reference="c1", stream=stream),
                      schema.QueryOffsetResponse).offset == 2
        for how in _ways(broker):
            out = ctl(*how, "list_stream_tracking", stream).splitlines()
            assert out == [f"Listing tracking information for stream {stream} ...",
                           "type\tname\ttracking_value", "writer\tw1\t7", "offset\tc1\t2"]
            assert ctl(*how, "list_stream_tracking", stream, "--all").splitlines() == out
            assert ctl(*how, "list_stream_tracking", stream, "--offset",
                       "--vhost", "/").splitlines()[2:] == ["offset\tc1\t2"]
            assert ctl(*how, "list_stream_tracking", stream,
                       "--writer").splitlines()[2:] == ["writer\tw1\t7"]
            code, _, err = _ctl_fails(*how, "list_stream_tracking", stream + "-nope")
            assert (code, err) == (70, "Error:\nThe stream does not exist.\n")
    finally:
        p.call(schema.Delete(p.next_corr(), stream=stream), schema.DeleteResponse)
        p.close()


def test_X1_api_stream_connection_pages(broker: BrokerProcess) -> None:
    """rabbitmq_stream_management's per-connection pages: GET
    /api/stream/connections/{vhost}/{name} (the connection with its counts),
    .../publishers and .../consumers (that connection's only), DELETE closes it; a name
    that is no stream connection: 404."""
    def check() -> None:
        (con,) = get(broker, "/api/stream/consumers")
        (pub,) = get(broker, "/api/stream/publishers")
        cname, pname = con["connection_details"]["name"], pub["connection_details"]["name"]
        assert cname != pname
        page = get(broker, f"/api/stream/connections/%2F/{quote(cname, safe='')}")
        assert (page["name"], page["protocol"], page["consumers"], page["publishers"]) == (
            cname, "stream", 1, 0)
        base = f"/api/stream/connections/%2F/{quote(pname, safe='')}"
        assert get(broker, base + "/publishers") == [pub]
        assert get(broker, base + "/consumers") == []
        assert get(broker, f"/api/stream/connections/%2F/{quote(cname, safe='')}"
                           "/consumers") == [con]
        t = Target("ackmq", http_base(broker), "")
        assert t.call("GET", "/api/stream/connections/%2F/no-such-conn").status == 404
        # an AMQP connection is no stream connection
        amqp = [c["name"] for c in get(broker, "/api/connections") if c["protocol"] != "stream"]
        for n in amqp:
            assert t.call("GET", f"/api/stream/connections/%2F/{quote(n, safe='')}"
                          ).status == 404
    _run(broker, check)


def test_X1_api_stream_connection_delete_closes_it(broker: BrokerProcess) -> None:
    port = broker.stream_port
    p = StreamPeer(port)
    try:
        assert p.login() == 1
        mine = p.sock.getsockname()[1]
        (conn,) = [c for c in get(broker, "/api/stream/connections")
                   if c["peer_port"] == mine]
        r = Target("ackmq", http_base(broker), "").call(
            "DELETE", f"/api/stream/connections/%2F/{quote(conn['name'], safe='')}",
            headers={"X-Reason": "bye"})
        assert r.status == 204
        close = p.wait(schema.Close)
        assert close.reason == "bye"
    finally:
        p.close()


def test_X5_group_consumers_from_the_consumers_listing() -> None:
    """In process: a group is the single active consumers of one name on one stream (a
    plain subscription with the same name is none of it), the active one first."""
    from ackmq.ctl.streams import group_consumers

    def sub(sid: int, stream: str, name: str, sac: bool, active: bool) -> dict[str, Any]:
        props = {"name": name} | ({"single-active-consumer": "true"} if sac else {})
        return {"queue": {"name": stream}, "subscription_id": sid, "properties": props,
                "active": active, "connection_details": {"name": f"c{sid}"}}

    listing = [sub(1, "s", "g", True, False), sub(2, "s", "g", False, True),
               sub(3, "t", "g", True, True), sub(4, "s", "g", True, True),
               sub(5, "s", "h", True, True)]
    assert group_consumers(listing, "s", "g") == [
        {"subscription_id": 4, "connection_name": "c4", "state": "active"},
        {"subscription_id": 1, "connection_name": "c1", "state": "inactive"}]
    assert group_consumers(listing, "s", "nobody") == []
