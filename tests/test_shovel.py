"""V1: dynamic shovels with RabbitMQ's interface, side by side with RabbitMQ 3.10's
shovel plugin (skipped when it is not there): /api/parameters/shovel validation texts,
PUT/GET/DELETE, /api/shovels status, moving messages queue to queue and exchange to
exchange with RabbitMQ's forward and timestamp headers, the three ack modes,
src-delete-after (queue-length, N: the shovel deletes itself), definitions both ways;
on ackmq alone: ctl's verbs (texts recorded from rabbitmqctl), restart survival.

Every test runs in a vhost of its own on either broker, deleted afterwards."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerProcess
from support.mgmthelp import Target, q, rabbit_http
from support.shovelhelp import RABBIT_AMQP, Side, drop_side, http_target, make_side


@pytest.fixture(scope="module")
def ackmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("shovel"), "--http-port", "0")
    b.start()
    yield b
    b.stop()


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "ackmq":
        b = request.getfixturevalue("ackmq_broker")
        s = make_side("ackmq", http_target(b), b.url)
    else:
        s = make_side("rabbitmq", Target("rabbitmq", rabbit_http(), RABBIT_AMQP), RABBIT_AMQP)
    yield s
    drop_side(s)


def _good(s: Side, **extra: Any) -> dict[str, Any]:
    return {"src-uri": s.local, "src-queue": "src", "dest-uri": s.local,
            "dest-queue": "dst", **extra}


# RabbitMQ 3.10's answers (recorded from its shovel plugin; the test re-checks them there)
_MISSING_BOTH = ("Must specify 'src-exchange' or 'src-queue'\nKey \"dest-uri\" not found in "
                 "{name}\nKey \"src-uri\" not found in {name}")
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    ("empty", {}, 400, _MISSING_BOTH),
    ("bad-uri", {"src-uri": "http://x", "src-queue": "a", "dest-uri": "amqp://",
                 "dest-queue": "b"},
     400, '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'),
    ("uri-int", {"src-uri": 5, "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"},
     400, "src-uri should be list, actually was 5"),
    ("no-dest", {"src-uri": "amqp://", "src-queue": "a"}, 400,
     'Key "dest-uri" not found in {name}'),
    ("both-src", {"src-uri": "amqp://", "src-queue": "a", "src-exchange": "x",
                  "dest-uri": "amqp://", "dest-queue": "b"},
     400, "Cannot specify 'src-exchange' and 'src-queue'"),
    ("both-dest", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                   "dest-queue": "b", "dest-exchange": "x"},
     400, "Cannot specify 'dest-exchange' and 'dest-queue'"),
    ("ack-mode", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                  "dest-queue": "b", "ack-mode": "sometimes"},
     400, 'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
          'actually was <<"sometimes">>'),
    ("prefetch", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                  "dest-queue": "b", "src-prefetch-count": "x"},
     400, 'src-prefetch-count should be a number, actually was <<"x">>'),
    ("delete-after", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                      "dest-queue": "b", "src-delete-after": -5},
     400, 'src-delete-after should be a number greater than or equal to 0, "never" or '
          '"queue-length", actually was -5'),
    ("reconnect", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                   "dest-queue": "b", "reconnect-delay": "soon"},
     400, 'reconnect-delay should be a number, actually was <<"soon">>'),
    ("forward", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                 "dest-queue": "b", "add-forward-headers": "yes"},
     400, 'add-forward-headers should be boolean, actually was <<"yes">>'),
    ("timestamp", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                   "dest-queue": "b", "dest-add-timestamp-header": 1},
     400, "dest-add-timestamp-header should be boolean, actually was 1"),
    ("unknown", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                 "dest-queue": "b", "bogus": 1},
     400, 'Unrecognised terms [{<<"bogus">>,1}] in {name}'),
    ("queue-int", {"src-uri": "amqp://", "src-queue": 1, "dest-uri": "amqp://",
                   "dest-queue": "b"}, 400, "src-queue should be binary, actually was 1"),
    ("key-only", {"src-uri": "amqp://", "src-exchange-key": "k", "dest-uri": "amqp://",
                  "dest-queue": "b"}, 400, "Must specify 'src-exchange' or 'src-queue'"),
    ("port", {"src-uri": "amqp://h:99999", "src-queue": "a", "dest-uri": "amqp://",
              "dest-queue": "b"},
     400, '"amqp://h:99999" not a valid URI: {{port_out_of_range,99999},"amqp://h:99999"}'),
    ("props-type", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                    "dest-queue": "b", "dest-publish-properties": {"delivery_mode": "x"}},
     400, 'delivery_mode should be a number, actually was <<"x">>'),
    ("props-unknown", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                       "dest-queue": "b", "dest-publish-properties": {"bogus": 1}},
     400, 'Unrecognised terms [{<<"bogus">>,1}] in dest-publish-properties'),
    ("props-string", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                      "dest-queue": "b", "dest-publish-properties": "x"},
     400, 'dest-publish-properties not a list <<"x">>'),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_V1_validation_texts_as_rabbitmq(side: Side, case: tuple[str, dict[str, Any], int,
                                                                   str]) -> None:
    name, value, status, text = case
    r = side.put(name, value)
    assert r.status == status, r
    want = "Validation failed\n\n" + text.replace("{name}", name) + "\n"
    assert r.body == {"error": "bad_request",
                      "reason": html.escape(want, quote=False)}, r.body
    assert side.t.call("GET", f"/api/parameters/shovel/{q(side.vhost)}/{name}").status == 404


def test_V1_missing_value_and_unknown_component(side: Side) -> None:
    r = side.t.call("PUT", f"/api/parameters/shovel/{q(side.vhost)}/x", {"component": "shovel"})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": "[{key_missing,value}]"})
    r = side.t.call("PUT", f"/api/parameters/nocomponent/{q(side.vhost)}/x", {"value": {}})
    assert (r.status, r.body["reason"]) == (
        400, "Validation failed\n\ncomponent nocomponent not found\n")
    r = side.t.call("PUT", "/api/parameters/shovel/no-such-vhost-38/x", {"value": _good(side)})
    assert (r.status, r.body) == (404, {"error": "not_found", "reason": "vhost_not_found"})


def test_V1_put_get_delete_and_status(side: Side) -> None:
    value = _good(side)
    assert side.put("s1", value).status == 201
    assert side.put("s1", value).status == 204
    r = side.t.call("GET", f"/api/parameters/shovel/{q(side.vhost)}/s1")
    assert r.status == 200 and r.body == {"value": value, "vhost": side.vhost,
                                          "component": "shovel", "name": "s1"}
    listed = side.t.call("GET", f"/api/parameters/shovel/{q(side.vhost)}").body
    assert [p["name"] for p in listed] == ["s1"]
    s = side.wait_state("s1", "running")
    assert {k: v for k, v in s.items() if k not in ("node", "timestamp")} == {
        "name": "s1", "vhost": side.vhost, "type": "dynamic", "state": "running",
        "src_uri": side.local, "src_protocol": "amqp091", "dest_protocol": "amqp091",
        "dest_uri": side.local, "src_queue": "src", "dest_queue": "dst"}
    assert side.delete("s1").status == 204
    assert side.t.call("GET", f"/api/parameters/shovel/{q(side.vhost)}/s1").status == 404
    assert side.delete("s1").status == 404
    side.wait(lambda: side.status("s1") is None, "shovel gone from /api/shovels")


def test_V1_moves_in_order_with_forward_and_timestamp_headers(side: Side) -> None:
    side.publish("src", 50)
    assert side.put("fw", _good(side, **{"add-forward-headers": True,
                                        "dest-add-timestamp-header": True})).status == 201
    side.wait(lambda: side.depth("dst") == 50, "50 moved")
    got = side.drain("dst")
    assert [b for b, _p in got] == [b"m%d" % i for i in range(50)]
    headers = got[0][1].headers
    fwd = headers["x-shovelled"][0]
    assert list(fwd) == ["shovelled-by", "shovel-type", "shovel-name", "shovel-vhost",
                         "src-uri", "dest-uri", "src-queue", "dest-queue"]
    assert {k: v for k, v in fwd.items() if k != "shovelled-by"} == {
        "shovel-type": "dynamic", "shovel-name": "fw", "shovel-vhost": side.vhost,
        "src-uri": side.local, "dest-uri": side.local, "src-queue": "src",
        "dest-queue": "dst"}
    assert isinstance(headers["x-shovelled-timestamp"], int)
    assert got[0][1].message_id == "id0" and got[0][1].delivery_mode == 2
    assert side.depth("src") == 0


def test_V1_src_delete_after_queue_length_deletes_the_shovel(side: Side) -> None:
    side.publish("src", 30)
    assert side.put("ql", _good(side, **{"src-delete-after": "queue-length"})).status == 201
    side.wait(lambda: side.t.call("GET", f"/api/parameters/shovel/{q(side.vhost)}").body
              == [], "the shovel deleted itself")
    assert side.depth("dst") == 30
    side.publish("src", 5, start=30, declare=False)
    assert side.depth("src") == 5 and side.depth("dst") == 30


def test_V1_src_delete_after_n(side: Side) -> None:
    side.publish("src", 30)
    assert side.put("n", _good(side, **{"src-delete-after": 10})).status == 201
    side.wait(lambda: side.t.call("GET", f"/api/parameters/shovel/{q(side.vhost)}").body
              == [], "the shovel deleted itself")
    side.wait(lambda: side.depth("src") == 20, "20 left at the source")
    assert [b for b, _p in side.drain("dst")] == [b"m%d" % i for i in range(10)]


@pytest.mark.parametrize("mode", ["no-ack", "on-publish", "on-confirm"])
def test_V1_ack_modes_move_everything(side: Side, mode: str) -> None:
    side.publish("src", 40)
    assert side.put("m", _good(side, **{"ack-mode": mode})).status == 201
    side.wait(lambda: side.depth("dst") == 40, f"40 moved ({mode})")
    assert side.depth("src") == 0


def test_V1_exchange_to_exchange_with_keys(side: Side) -> None:
    conn = side.connect()
    ch = conn.channel()
    ch.exchange_declare("in", "topic", durable=True)
    ch.exchange_declare("out", "direct", durable=True)
    ch.queue_declare("landed", durable=True)
    ch.queue_bind("landed", "out", "moved")
    value = {"src-uri": side.local, "src-exchange": "in", "src-exchange-key": "a.#",
             "dest-uri": side.local, "dest-exchange": "out", "dest-exchange-key": "moved"}
    assert side.put("x", value).status == 201
    st = side.wait_state("x", "running")
    assert (st["src_exchange"], st["src_exchange_key"], st["dest_exchange"],
            st["dest_exchange_key"]) == ("in", "a.#", "out", "moved")
    ch.confirm_delivery()
    for key in ("a.1", "b.1", "a.2"):
        ch.basic_publish("in", key, key.encode())
    conn.close()
    side.wait(lambda: side.depth("landed") == 2, "the two a.# messages moved")
    assert [b for b, _p in side.drain("landed")] == [b"a.1", b"a.2"]


def test_V1_definitions_carry_shovels_as_rabbitmq(side: Side) -> None:
    value = _good(side)
    assert side.put("d", value).status == 201
    defs = side.t.call("GET", f"/api/definitions/{q(side.vhost)}").body
    assert {"value": value, "vhost": side.vhost, "component": "shovel",
            "name": "d"} in defs["parameters"]
    full = side.t.call("GET", "/api/definitions").body
    assert {"value": value, "vhost": side.vhost, "component": "shovel",
            "name": "d"} in full["parameters"]
    assert side.delete("d").status == 204
    r = side.t.call("POST", f"/api/definitions/{q(side.vhost)}",
                    {"parameters": [{"value": value, "vhost": side.vhost,
                                     "component": "shovel", "name": "d2"}]})
    assert r.status in (200, 201, 204), r
    side.wait_state("d2", "running")


# -- ackmq alone --------------------------------------------------------------------------
def _ctl(b: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                           str(b.data_dir), *args], capture_output=True, text=True,
                          timeout=60)


def test_V1_ctl_shovel_status_restart_delete(ackmq_broker: BrokerProcess) -> None:
    """Texts and exit codes as rabbitmqctl 3.10's (recorded): status columns, restart and
    delete lines, 69 with "Shovel with the given name was not found …"."""
    s = make_side("ackmq", http_target(ackmq_broker), ackmq_broker.url)
    try:
        assert s.put("c1", _good(s)).status == 201
        s.wait_state("c1", "running")
        r = _ctl(ackmq_broker, "shovel_status")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("Shovel status on node ackmq@")
        assert lines[1].split("\t") == [
            "destination", "destination_protocol", "destination_queue", "last_changed",
            "name", "source", "source_protocol", "source_queue", "state",
            "termination_reason", "type", "vhost"]
        row = next(x.split("\t") for x in lines[2:] if f"\t{s.vhost}" in x)
        assert row[:3] == [s.local, "amqp091", "dst"] and row[4:10] == [
            "c1", s.local, "amqp091", "src", "running", ""] and row[10:] == [
            "dynamic", s.vhost]
        r = _ctl(ackmq_broker, "restart_shovel", "-p", s.vhost, "c1")
        assert r.returncode == 0 and r.stdout.startswith(
            f"Restarting dynamic Shovel c1 in virtual host {s.vhost} on node ackmq@"), r
        s.wait_state("c1", "running")
        r = _ctl(ackmq_broker, "delete_shovel", "-p", s.vhost, "c1")
        assert (r.returncode, r.stdout) == (0, f"Deleting shovel c1 in vhost {s.vhost}\n")
        r = _ctl(ackmq_broker, "delete_shovel", "-p", s.vhost, "c1")
        assert r.returncode == 69
        assert r.stderr.startswith("Error:\nShovel with the given name was not found on "
                                   "the target node 'ackmq@")
        assert r.stderr.rstrip().endswith(f"and / or virtual host '{s.vhost}'")
        r = _ctl(ackmq_broker, "restart_shovel", "-p", s.vhost, "nope")
        assert r.returncode == 69
    finally:
        drop_side(s)


def test_V1_shovel_survives_a_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", "--http-port", "0")
    b.start()
    try:
        s = make_side("ackmq", http_target(b), b.url)
        assert s.put("keep", _good(s)).status == 201
        s.wait_state("keep", "running")
        b.stop()
        b.start()
        s.t = http_target(b)
        s.publish("src", 10, declare=False)
        s.wait(lambda: s.depth("dst") == 10, "moved after the restart")
        assert s.status("keep")["state"] == "running"
        assert json.loads((tmp_path / "data" / "parameters.json").read_text())[
            "parameters"][0]["name"] == "keep"
    finally:
        b.stop()


def test_V1_publish_properties_set_on_every_message(side: Side) -> None:
    side.publish("src", 3)
    assert side.put("pp", _good(side, **{"dest-publish-properties": {
        "delivery_mode": 1, "priority": 3, "app_id": "mover", "timestamp": 1700000000}})
    ).status == 201
    side.wait(lambda: side.depth("dst") == 3, "moved")
    props = [p for _b, p in side.drain("dst")]
    assert [(p.delivery_mode, p.priority, p.app_id, p.timestamp, p.message_id)
            for p in props] == [(1, 3, "mover", 1700000000, f"id{i}") for i in range(3)]


def test_V1_fuzzed_shovel_definitions_answer_201_or_400(ackmq_broker: BrokerProcess) -> None:
    """Random values under every key: each PUT is 201 or a 400 with a reason, never a
    500; the shovels accepted run or wait to reconnect; no traceback in the log; the
    broker still moves messages for a good shovel afterwards."""
    import random
    s = make_side("ackmq", http_target(ackmq_broker), ackmq_broker.url)
    rnd = random.Random(38)
    keys = ["src-uri", "src-queue", "src-exchange", "src-exchange-key", "dest-uri",
            "dest-queue", "dest-exchange", "dest-exchange-key", "ack-mode",
            "src-delete-after", "src-prefetch-count", "reconnect-delay",
            "add-forward-headers", "dest-add-timestamp-header", "dest-publish-properties",
            "src-queue-args", "dest-queue-args", "src-consumer-args", "src-protocol",
            "ackmq-dest-x-first-death-queue", "dest-protocol", "src-address",
            "dest-address", "dest-properties", "dest-application-properties",
            "dest-message-annotations"]
    values: list[Any] = ["amqp://", "amqp:///nope", "amqp://127.0.0.1:1", "amqp://h:0",
                         "amqp://[::1", "", "q", "x" * 300, -1, 0, 1, 2**70, 1e308, 0.5,
                         True, False, None, [], ["amqp://"], {}, {"delivery_mode": 300},
                         {"x-max-length": "a"}, {"priority": -1}, "on-confirm", "no-ack",
                         "queue-length", "never", "amqp10", "/queue/q", {"subject": "s"},
                         {"creation_time": "x"}, {"a": 1}, "amqps://127.0.0.1:1"]
    try:
        for i in range(150):
            value = {k: rnd.choice(values) for k in rnd.sample(keys, rnd.randrange(1, 9))}
            if rnd.random() < 0.5:
                value.update({"src-uri": "amqp:///" + q(s.vhost), "src-queue": f"f{i}",
                              "dest-uri": "amqp:///" + q(s.vhost)})
            r = s.put(f"fuzz-{i}", value)
            assert r.status in (201, 400), (value, r)
            if r.status == 400:
                assert r.body["reason"].startswith("Validation failed"), r
        assert s.t.call("GET", "/api/shovels").status == 200
        assert s.t.call("GET", f"/api/definitions/{q(s.vhost)}").status == 200
        assert _ctl(ackmq_broker, "shovel_status").returncode == 0
        s.publish("src", 5)
        assert s.put("after", _good(s)).status == 201
        s.wait(lambda: s.depth("dst") == 5, "a good shovel still moves")
    finally:
        drop_side(s)
    assert not any("Traceback" in line for line in ackmq_broker.log), \
        "".join(ackmq_broker.log[-40:])


def test_V1_load_definitions_at_start_starts_the_shovels(tmp_path: Path) -> None:
    """`--load-definitions` with a RabbitMQ export's shovel: running once the broker is."""
    defs = {"vhosts": [{"name": "/"}], "queues": [
        {"name": "ld-src", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {}}],
        "parameters": [{"value": {"src-uri": "amqp://", "src-queue": "ld-src",
                                  "dest-uri": "amqp://", "dest-queue": "ld-dst"},
                        "vhost": "/", "component": "shovel", "name": "ld"}]}
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    b = BrokerProcess(tmp_path / "data", "--http-port", "0", "--load-definitions", str(path))
    b.start()
    try:
        s = Side("ackmq", http_target(b), "/", b.url)
        s.wait_state("ld", "running")
        s.publish("ld-src", 3, declare=False)
        s.wait(lambda: s.depth("ld-dst") == 3, "moved")
    finally:
        b.stop()


def test_V1_a_shovel_replaced_as_it_connects_does_not_hang_the_broker_stop(
        tmp_path: Path) -> None:
    """A shovel PUT twice at once: the first worker is stopped while its connections are
    still opening. Python 3.11's wait_for swallowed that cancel when it landed as the
    handshake completed, the worker then waited for its session's end forever, and the
    broker's shutdown with it (SIGTERM: still running 30 s later). It must stop at once."""
    import signal
    import time

    b = BrokerProcess(tmp_path, "--http-port", "0")
    b.start()
    try:
        s = make_side("ackmq", http_target(b), b.url)
        for _ in range(3):  # the race is the second PUT landing during the first's connect
            assert s.put("twice", _good(s)).status in (201, 204)
            assert s.put("twice", _good(s)).status == 204
            s.wait_state("twice", "running")
            assert s.delete("twice").status == 204
        assert b.proc is not None
        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        b.proc.wait(10)  # raises TimeoutExpired where the old worker hung the stop
        assert time.monotonic() - t0 < 10
    finally:
        b.stop()
