"""`ackmq serve --config FILE` (issue 20): rabbitmq.conf-style keys where RabbitMQ has
them, `ackmq.<option>` for the rest, flags over the file, and a bad line stops the
start with exit code 2 and a message naming it. Each test runs `ackmq serve` in a
subprocess."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ackmq", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_listening(p: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The broker's log up to its 'ackmq listening on' line."""
    assert p.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "ackmq listening on" in line:
            return "".join(seen)
    p.kill()
    raise AssertionError("the broker did not start:\n" + "".join(seen))


@pytest.fixture
def running() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def http_json(url: str, user: str, password: str) -> object:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_config_file_rabbitmq_keys_and_ackmq_keys(tmp_path: Path,
                                                  running: list[subprocess.Popen[str]]
                                                  ) -> None:
    amqp, stomp, http = free_port(), free_port(), free_port()
    conf = tmp_path / "ackmq.conf"
    conf.write_text(f"""\
# as in rabbitmq.conf
listeners.tcp.default = 127.0.0.1:{amqp}
stomp.listeners.tcp.1 = {stomp}
management.tcp.port = {http}
default_user = ops
default_pass = s3cret
heartbeat = 15
vm_memory_high_watermark.absolute = 3GiB
disk_free_limit.absolute = 1MB
handshake_timeout = 4000
frame_max = 131072

# ackmq's own
ackmq.data_dir = {tmp_path / "data"}
ackmq.fsync = false
ackmq.queue_memory_mb = 32
""")
    p = serve("--config", str(conf))
    running.append(p)
    log = wait_listening(p)
    assert "fsync OFF" in log and str(tmp_path / "data") in log
    assert (tmp_path / "data").is_dir()
    # default_user replaced guest; heartbeat as configured
    params = pika.ConnectionParameters("127.0.0.1", amqp,
                                       credentials=pika.PlainCredentials("ops", "s3cret"))
    conn = pika.BlockingConnection(params)
    try:
        assert conn._impl.params.heartbeat == 15  # type: ignore[attr-defined]
    finally:
        conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", amqp, credentials=pika.PlainCredentials("guest", "guest")))
    overview = http_json(f"http://127.0.0.1:{http}/api/overview", "ops", "s3cret")
    ports = {x["protocol"]: x["port"] for x in overview["listeners"]}  # type: ignore[index]
    assert ports["stomp"] == stomp and ports["http"] == http
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics)
               for s in f.samples}
    assert samples["rabbitmq_resident_memory_limit_bytes"] == 3 << 30
    assert samples["rabbitmq_disk_space_available_limit_bytes"] == 1_000_000


def test_config_file_flags_override_it(tmp_path: Path,
                                       running: list[subprocess.Popen[str]]) -> None:
    file_port, flag_port = free_port(), free_port()
    conf = tmp_path / "ackmq.conf"
    conf.write_text(f"listeners.tcp.default = {file_port}\nackmq.persistence = false\n"
                    "ackmq.stomp = false\nackmq.http = false\n")
    p = serve("--config", str(conf), "--port", str(flag_port))
    running.append(p)
    log = wait_listening(p)
    assert f":{flag_port}/" in log and f":{file_port}" not in log
    assert "no persistence" in log and "stomp://" not in log and "http://" not in log
    pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{flag_port}/")).close()


@pytest.mark.parametrize("line, message", [
    ("no.such.key = 1", "unknown key 'no.such.key'"),
    ("heartbeat = soon", "heartbeat = soon: 'soon' is not a whole number"),
    ("listeners.tcp.default = 70000", "70000 is not a port"),
    ("vm_memory_high_watermark.relative = 4", "is not a fraction of RAM"),
    ("disk_free_limit.absolute = lots", "is not an amount of memory"),
    ("ssl_options.verify = maybe", "verify_peer or verify_none"),
    ("frame_max = 4096", "frame_max is fixed at 131072"),
    ("ackmq.fsync = sometimes", "'sometimes' is not true or false"),
    ("ackmq.no_such_option = 1", "unknown key 'ackmq.no_such_option'"),
    ("heartbeat 30", "expected 'key = value'"),
])
def test_config_file_bad_line_stops_the_start(tmp_path: Path, line: str,
                                              message: str) -> None:
    conf = tmp_path / "ackmq.conf"
    conf.write_text(f"# a comment\n\n{line}\n")
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--config", str(conf),
                        "--port", "0", "--no-stomp", "--no-http", "--no-persistence"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert f"{conf}:3: " in r.stderr and message in r.stderr, r.stderr


@pytest.mark.parametrize("line, message", [
    ("listeners.tcp.default = 65536", "65536 is not a port (0 to 65535)"),
    ("listeners.tcp.default = -1", "-1 is not a port (0 to 65535)"),
    ("consumer_timeout = -5", "-5 must not be negative"),
    ("handshake_timeout = 0", "0 must be a positive number of milliseconds"),
    ("vm_memory_high_watermark.relative = -0.1", "-0.1 is not a fraction of RAM"),
    ("vm_memory_high_watermark.relative = nan", "nan is not a fraction of RAM"),
])
def test_config_file_numbers_out_of_range(line: str, message: str) -> None:
    """Every bounded number is checked by one rule (a NaN lies in no range), in-process."""
    from ackmq.server.conffile import ConfigFileError, parse
    with pytest.raises(ConfigFileError, match=re.escape(f"x.conf:1: {line}: {message}")):
        parse(line + "\n", [], "x.conf")


def test_config_file_numbers_in_range() -> None:
    from ackmq.server.conffile import parse
    assert parse("listeners.tcp.default = 65535\nconsumer_timeout = 0\n"
                 "handshake_timeout = 1\nvm_memory_high_watermark.relative = 1\n", []) == {
        "port": 65535, "consumer_timeout_ms": 0, "handshake_timeout": 0.001,
        "memory_high_watermark": "1.0"}


def test_config_file_key_set_twice(tmp_path: Path) -> None:
    conf = tmp_path / "ackmq.conf"
    conf.write_text("heartbeat = 10\nheartbeat = 20\n")
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--config", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"{conf}:2: heartbeat is set twice (first on line 1)" in r.stderr


def test_config_file_missing(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--config",
                        str(tmp_path / "nope.conf")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "cannot read the config file" in r.stderr


def test_config_file_documented_example_parses() -> None:
    """The full example of docs/config.md is a valid file (so the doc stays true)."""
    import argparse

    from ackmq import cli
    from ackmq.server.conffile import Option, parse
    doc = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    example = doc.split("```ini\n", 1)[1].split("```", 1)[0]
    p = argparse.ArgumentParser()
    cli._serve_args(p)
    opts = [Option(a.dest, a.type or str, a.nargs == 0) for a in p._actions
            if a.dest not in ("help", "config")]
    values = parse(example, opts)
    assert values["port"] == 5672 and values["http_port"] == 15672
    assert values["handshake_timeout"] == 10.0 and values["no_fsync"] is False
    assert values["memory_high_watermark"] == "0.4"
    # every line that sets something is understood: uncommenting all keeps it valid
    uncommented = "\n".join(line[2:] if line.startswith("# ") and "=" in line
                             and " " not in line[2:].split("=")[0].strip() else line
                             for line in example.splitlines())
    dup = {"vm_memory_high_watermark.absolute", "disk_free_limit.relative",
           "stomp.listeners.tcp"}  # alternatives of keys set above
    parse("\n".join(x for x in uncommented.splitlines()
                     if x.split("=")[0].strip() not in dup), opts)


def test_U4_mqtt_ssl_cert_login_key() -> None:
    """RabbitMQ's `mqtt.ssl_cert_login` is `--mqtt-ssl-cert-login` (docs/mqtt.md)."""
    from ackmq.server.conffile import parse
    assert parse("mqtt.ssl_cert_login = true\n", []) == {"mqtt_ssl_cert_login": True}
