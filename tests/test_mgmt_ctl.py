"""M4: `ackmq ctl` list_* / purge_queue / delete_queue / close_connection / status with
rabbitmqctl's columns and `--formatter json`, over the admin socket and over the HTTP
API (`--url`). The same topology is made in RabbitMQ and ackmq and listed by
`rabbitmqctl` (when it can run here), by `ackmq ctl --url` against RabbitMQ's API, and
by `ackmq ctl` against ackmq: the outputs are compared line for line."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess
from support.mgmthelp import Target, q, rabbit_http

from ackmq.cli import main

HTTP_URL = re.compile(r"(http://\S+?:\d+)")


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """`ackmq ctl ARGS` in this process (a subprocess per call costs seconds of imports
    on a loaded machine); the broker is still another process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ctl", *args])
    return subprocess.CompletedProcess(["ackmq", "ctl", *args], code, out.getvalue(),
                                       err.getvalue())


def ok(*args: str) -> str:
    r = ctl(*args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("ctl") / "data")
    b.start()
    yield b
    b.stop()


def http_of(b: BrokerProcess) -> str:
    m = HTTP_URL.search("".join(b.log))
    assert m, b.log
    return m.group(1).replace("http://", "http://guest:guest@")


def _declare(amqp_url: str, vhost: str, names: dict[str, str]) -> None:
    params = pika.URLParameters(amqp_url)
    params.virtual_host = vhost
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare(names["x"], "topic", durable=True)
    ch.queue_declare(names["q"], durable=True, arguments={
        "x-max-length": 10, "x-dead-letter-exchange": "dlx", "x-flag": True})
    ch.queue_bind(names["q"], names["x"], "a.#")
    ch.basic_publish("", names["q"], b"one")
    ch.basic_publish("", names["q"], b"two")
    conn.close()


def test_M4_list_verbs_match_rabbitmqctl(proc: BrokerProcess) -> None:
    base = rabbit_http()
    rabbit = Target("rabbitmq", base, "amqp://guest:guest@127.0.0.1:5672/")
    names = {"x": "ctl-x", "q": "ctl-q"}
    try:
        vh = rabbit.vhost()
        _declare(rabbit.amqp_url, vh, names)
        ours = Target("ackmq", http_of(proc).replace("guest:guest@", ""), proc.url)
        assert ours.call("PUT", f"/api/vhosts/{q(vh)}").status == 201
        _declare(proc.url, vh, names)
        verbs = [["list_queues", "name", "messages", "durable", "arguments", "exclusive"],
                 ["list_exchanges", "name", "type", "durable", "auto_delete", "internal"],
                 ["list_bindings"],
                 ["list_queues", "name", "arguments", "--formatter", "json"]]
        deadline = time.monotonic() + 30  # RabbitMQ's API counts lag by its stats interval
        while rabbit.call("GET", f"/api/queues/{q(vh)}/ctl-q").body.get("messages") != 2:
            assert time.monotonic() < deadline
            time.sleep(0.25)
        rabbitmqctl = shutil.which("rabbitmqctl")
        for verb in verbs:
            args = [verb[0], "-p", vh, *verb[1:]]
            mine = ok("--data-dir", str(proc.data_dir), *args)
            over_http = ok("--url", http_of(proc), *args)
            theirs = ok("--url", base.replace("http://", "http://guest:guest@"), *args)
            assert sorted(mine.splitlines()) == sorted(over_http.splitlines()), verb
            assert sorted(_no_system(mine)) == sorted(_no_system(theirs)), verb
            if rabbitmqctl is not None and verb[0] == "list_queues":  # (slow: ~3 s each)
                r = subprocess.run([rabbitmqctl, *args], capture_output=True, text=True,
                                   timeout=60)
                if r.returncode == 0:
                    assert sorted(_no_system(r.stdout)) == sorted(_no_system(mine)), verb
    finally:
        rabbit.forget()


def _no_system(out: str) -> list[str]:
    """Lines of a listing without RabbitMQ's own amq.rabbitmq.trace exchange (ackmq has
    no tracing), JSON output's separators normalized, and queue arguments in one order:
    RabbitMQ's HTTP API answers them sorted, rabbitmqctl in the declared order."""
    lines = []
    for line in out.splitlines():
        if "amq.rabbitmq.trace" in line or line in ("[", "]"):
            continue
        line = line.lstrip(",")
        if line.startswith("{"):
            obj = json.loads(line)
            if isinstance(obj.get("arguments"), list):  # the API's JSON has no AMQP
                obj["arguments"] = sorted(  # integer widths: ackmq ctl says "long"
                    [k, "long" if t in ("signedint", "short", "byte") else t, v]
                    for k, t, v in obj["arguments"])
            line = json.dumps(obj, sort_keys=True)
        else:
            line = re.sub(r"\[\{.*\}\]", lambda m: "[{" + "},{".join(
                sorted(m.group(0)[2:-2].split("},{"))) + "}]", line)
        lines.append(line)
    return lines


def test_M4_connections_channels_consumers_and_close(proc: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=3)
        qname = ch.queue_declare("", exclusive=True).method.queue
        tag = "ctl-" + uuid.uuid4().hex[:6]
        ch.basic_consume(qname, lambda *a: None, consumer_tag=tag)
        d = str(proc.data_dir)
        out = ok("--data-dir", d, "list_connections", "name", "user", "vhost", "channels",
                 "protocol")
        lines = out.splitlines()
        assert lines[:2] == ["Listing connections ...", "name\tuser\tvhost\tchannels\tprotocol"]
        row = next(r.split("\t") for r in lines[2:] if "\tguest\t" in r)
        assert row[1:] == ["guest", "/", "1", "AMQP 0-9-1"]
        name = row[0]
        assert ok("--data-dir", d, "list_channels").splitlines()[1:] == [
            "pid\tuser\tconsumer_count\tmessages_unacknowledged", f"{name} (1)\tguest\t1\t0"]
        out = ok("--data-dir", d, "list_consumers", "--formatter", "json")
        assert json.loads(out) == [{"queue_name": qname, "channel_pid": f"{name} (1)",
                                    "consumer_tag": tag, "ack_required": True,
                                    "prefetch_count": 3, "active": True, "arguments": []}]
        assert "Closing connection" in ok("--url", http_of(proc), "close_connection", name,
                                          "go away")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            conn.process_data_events(5)
            conn.process_data_events(5)
        assert (e.value.reply_code, e.value.reply_text) == (320, "CONNECTION_FORCED - go away")
        r = ctl("--data-dir", d, "close_connection", name, "again")
        assert r.returncode == 69 and "not found" in r.stderr
    finally:
        if conn.is_open:
            conn.close()


def test_M4_purge_and_delete_queue(proc: BrokerProcess) -> None:
    names = {"x": "pd-x", "q": "pd-q-" + uuid.uuid4().hex[:6]}
    _declare(proc.url, "/", names)
    d = str(proc.data_dir)
    assert f"{names['q']}\t2" in ok("--data-dir", d, "list_queues")
    assert ok("--data-dir", d, "purge_queue", names["q"]) == (
        f"Purging queue '{names['q']}' in vhost '/' ...\n")
    assert f"{names['q']}\t0" in ok("--data-dir", d, "list_queues")
    out = ok("--url", http_of(proc), "delete_queue", names["q"])
    assert out.splitlines() == [f"Deleting queue '{names['q']}' on vhost '/' ...",
                                "Queue was successfully deleted with 0 messages"]
    r = ctl("--data-dir", d, "delete_queue", names["q"])
    assert (r.returncode, r.stderr) == (64, "Error:\nQueue not found\n")
    r = ctl("--data-dir", d, "list_queues", "nosuchcolumn")
    assert r.returncode == 64 and "Info key(s) nosuchcolumn are not supported" in r.stderr


def test_M4_status_and_environment(proc: BrokerProcess) -> None:
    d = str(proc.data_dir)
    st = json.loads(ok("--data-dir", d, "status", "--formatter", "json"))
    for key in ("pid", "uptime", "alarms", "listeners", "memory", "disk_free",
                "disk_free_limit", "vm_memory_high_watermark_limit", "totals",
                "product_name", "product_version", "rabbitmq_version"):
        assert key in st, key
    assert st["alarms"] == []
    assert {"amqp", "http"} <= {x["protocol"] for x in st["listeners"]}
    assert st == {**json.loads(ok("--url", http_of(proc), "status", "--formatter", "json")),
                  "uptime": st["uptime"], "memory": st["memory"], "disk_free": st["disk_free"]}
    text = ok("--data-dir", d, "status")
    assert text.startswith("Status of node ackmq@") and "Listeners" in text
    assert "Application environment of node" in ok("--data-dir", d, "environment")


def test_M4_export_import_definitions_over_url(proc: BrokerProcess, tmp_path: Path) -> None:
    names = {"x": "dx-" + uuid.uuid4().hex[:6], "q": "dq-" + uuid.uuid4().hex[:6]}
    _declare(proc.url, "/", names)
    f = tmp_path / "defs.json"
    ok("--url", http_of(proc), "export_definitions", str(f))
    defs = json.loads(f.read_text())
    assert {"source": names["x"], "vhost": "/", "destination": names["q"],
            "destination_type": "queue", "routing_key": "a.#", "arguments": {}} \
        in defs["bindings"]
    ok("--data-dir", str(proc.data_dir), "delete_queue", names["q"])
    ok("--url", http_of(proc), "import_definitions", str(f))
    assert f"{names['q']}\t0" in ok("--data-dir", str(proc.data_dir), "list_queues")
    ok("--data-dir", str(proc.data_dir), "export_definitions", str(f))
    ok("--data-dir", str(proc.data_dir), "delete_queue", names["q"])
    assert f"{names['q']}\t" not in ok("--data-dir", str(proc.data_dir), "list_queues")
    ok("--data-dir", str(proc.data_dir), "import_definitions", str(f))
    assert f"{names['q']}\t0" in ok("--data-dir", str(proc.data_dir), "list_queues")


def test_M4_user_verbs_over_url(proc: BrokerProcess) -> None:
    """rabbitmqctl's user/vhost/permission verbs with --url: the same output as over
    the admin socket."""
    url, d = http_of(proc), str(proc.data_dir)
    user, vh = "u-" + uuid.uuid4().hex[:6], "vh-" + uuid.uuid4().hex[:6]
    assert ok("--url", url, "add_user", user, "pw1") == f'Adding user "{user}" ...\n'
    r = ctl("--url", url, "add_user", user, "pw1")
    assert (r.returncode, r.stderr) == (70, f'Error:\nUser "{user}" already exists\n')
    ok("--url", url, "set_user_tags", user, "management", "monitoring")
    ok("--url", url, "add_vhost", vh)
    ok("--url", url, "set_permissions", "-p", vh, user, "^c", "^w", "^r")
    for verb in (["list_users"], ["list_vhosts"], ["list_permissions", "-p", vh],
                 ["list_user_permissions", user]):
        assert sorted(ok("--url", url, *verb).splitlines()) == sorted(
            ok("--data-dir", d, *verb).splitlines()), verb
    assert f"{user}\t[management, monitoring]" in ok("--url", url, "list_users")
    ok("--url", url, "change_password", user, "pw2")
    params = pika.URLParameters(proc.url.replace("guest:guest", f"{user}:pw2"))
    params.virtual_host = vh
    pika.BlockingConnection(params).close()
    ok("--url", url, "clear_permissions", "-p", vh, user)
    assert ok("--url", url, "list_user_permissions", user).splitlines() == [
        f'Listing permissions for user "{user}" ...']
    ok("--url", url, "delete_vhost", vh)
    ok("--url", url, "delete_user", user)
    r = ctl("--url", url, "delete_user", user)
    assert (r.returncode, r.stderr) == (67, f'Error:\nUser "{user}" does not exist\n')
