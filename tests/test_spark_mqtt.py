"""S11: what MQTT devices publish at QoS 1 lands in a Spark table exactly once, with its
topic and MQTT properties as columns (docs/mqtt.md "Into Spark", docs/spark.md).

Devices are paho-mqtt clients (3.1.1 and 5.0) publishing to a real `ackmq serve` while
`ackmq pipeline land --mqtt` lands the queue and is SIGKILLed and restarted; the docs'
example runs as written (ports and paths aside) on the module's Spark session."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerProcess
from support.mqtthelp import paho
from support.seed import run_seed

pa = pytest.importorskip("pyarrow")

from ackmq.spark.lake import read_committed  # noqa: E402
from ackmq.spark.schema import ARROW_SCHEMA  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"
KILLS = int(os.environ.get("ACKMQ_SPARK_KILLS", "1"))  # driver SIGKILLs mid-stream


def test_S11_mqtt_columns_come_from_the_routing_key_and_the_qos_header() -> None:
    """In process, no JVM: `topic` is the routing key in MQTT form when the message went
    through amq.topic (null otherwise), `qos` RabbitMQ's `x-mqtt-publish-qos` header (null
    when absent or not a QoS: a header set by hand must not fail the read task)."""
    from ackmq.spark.mqtt_columns import with_mqtt_columns

    rows = [("devices.d1.temp", "amq.topic", [("x-mqtt-publish-qos", "1")]),
            ("devices.d1.temp", "", [("x-mqtt-publish-qos", "0")]),
            ("a.b.c", "amq.topic", [("x-mqtt-publish-qos", "banana")]),
            ("a", "amq.topic", None)]
    batch = pa.RecordBatch.from_pylist(
        [{"offset": i, "routing_key": rk, "exchange": x, "headers": h}
         for i, (rk, x, h) in enumerate(rows)], schema=ARROW_SCHEMA)
    out = with_mqtt_columns(batch)
    assert out.schema.names[-2:] == ["topic", "qos"]
    assert out.column("topic").to_pylist() == ["devices/d1/temp", None, "a/b/c", "a"]
    assert out.column("qos").to_pylist() == [1, 0, None, None]


def test_S11_mqtt_columns_are_for_a_queue_not_a_stream(tmp_path: Path) -> None:
    """No JVM: `option("mqtt")` with `option("stream")` is refused in words (a stream's
    rows have no MQTT columns), and so is `pipeline land --stream --mqtt`: one line,
    exit 1, before Spark starts."""
    pytest.importorskip("pyspark")
    from ackmq.spark.source import AckmqDataSource

    with pytest.raises(ValueError, match="option\\('mqtt'\\) is for option\\('queue'\\)"):
        AckmqDataSource({"stream": "s", "mqtt": "true"}).schema()
    assert AckmqDataSource({"queue": "q", "mqtt": "true"}).schema().endswith(
        ", topic string, qos int")
    assert "topic" not in AckmqDataSource({"queue": "q"}).schema()
    p = subprocess.run([sys.executable, "-m", "ackmq", "pipeline", "land", "--stream", "s",
                        "--mqtt", "--to", str(tmp_path / "lake"), "--checkpoint",
                        str(tmp_path / "chk")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip() == ("ackmq pipeline land: --mqtt is for --queue (a stream's "
                                "rows have no MQTT columns)"), p.stderr


def _need_spark() -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("spark-mqtt"))
    b.start()
    assert b.mqtt_port > 0
    yield b
    b.stop()
    assert not [ln for ln in b.log if "Traceback" in ln], "".join(b.log[-50:])


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    _need_spark()
    from ackmq.spark.pipeline import spark_session

    s = spark_session("ackmq-mqtt-tests")
    yield s
    s.stop()


class Devices(threading.Thread):
    """`k` devices (even: MQTT 3.1.1, odd: MQTT 5 with properties) each publishing bodies
    `<device>:<i>` at QoS 1 to `devices/<device>/temp`, each PUBACK awaited, at a steady
    pace, until `stop` is set and each has published at least `at_least`."""

    def __init__(self, port: int, k: int, at_least: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.k, self.at_least, self.rate = port, k, at_least, rate
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.acked = [0] * k
        self.names = [f"dev{j}-{uuid.uuid4().hex[:6]}" for j in range(k)]

    def run(self) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties
        clients = []
        try:
            for j, name in enumerate(self.names):
                clients.append(paho(self.port, name, v5=bool(j % 2)))
            i = 0
            while i < self.at_least or not self.stop.is_set():
                for j, c in enumerate(clients):
                    props = None
                    if j % 2:
                        props = Properties(PacketTypes.PUBLISH)
                        props.UserProperty = [("site", "lab"), ("seq", str(i))]
                        props.ContentType = "text/plain"
                        props.CorrelationData = f"c-{i}".encode()
                        props.ResponseTopic = f"devices/{self.names[j]}/reply"
                    info = c.publish(f"devices/{self.names[j]}/temp",
                                     f"{self.names[j]}:{i}".encode(), qos=1, properties=props)
                    info.wait_for_publish(30)
                    assert info.is_published(), f"no PUBACK for {self.names[j]}:{i}"
                    self.acked[j] = i + 1
                i += 1
                time.sleep(self.k / self.rate)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            for c in clients:
                c.disconnect()
                c.loop_stop()


class Driver:
    """`ackmq pipeline land --mqtt` in its own process group (killed as a whole)."""

    def __init__(self, url: str, queue: str, work: Path, *, available_now: bool) -> None:
        cmd = [sys.executable, "-m", "ackmq.spark", "pipeline", "land", "--url", url,
               "--queue", queue, "--mqtt", "--to", str(work / "lake"),
               "--checkpoint", str(work / "chk"), "--max-per-trigger", "200"]
        if available_now:
            cmd.append("--available-now")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.landed = threading.Event()
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if re.match(r"batch \d+: [1-9]", line):
                self.landed.set()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()


def _queue_state(url: str, queue: str) -> tuple[int, int]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = conn.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_S11_mqtt_devices_land_exactly_once_through_driver_kills(
        broker: BrokerProcess, tmp_path: Path) -> None:
    """4 devices (two 3.1.1, two 5.0 with user properties, content type, correlation
    data, response topic) publish at QoS 1 into a queue bound to amq.topic with
    `devices.*.temp` while `pipeline land --mqtt` runs; its driver is SIGKILLed (its
    whole process group) 0-2 s after its first landed batch (once; $ACKMQ_SPARK_KILLS
    times: each restart replays what the kill left logged), then an `--available-now`
    run lands the rest. Every PUBACKed message is in the table exactly
    once, its `topic` the device's MQTT topic, `qos` 1, and the MQTT 5 properties in the
    AMQP columns RabbitMQ maps them to; the queue ends empty with no consumer."""
    _need_spark()
    seed = run_seed()
    rnd = random.Random(seed)
    url = broker.url
    queue = f"spark.mqtt.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, "amq.topic", "devices.*.temp")
    conn.close()
    devices = Devices(broker.mqtt_port, k=4, at_least=250, rate=100.0)
    devices.start()
    try:
        for _ in range(KILLS):
            d = Driver(url, queue, tmp_path, available_now=False)
            if not d.landed.wait(240):
                d.kill()
                pytest.fail("the landing never landed a batch:\n" + "".join(d.lines[-30:]))
            time.sleep(rnd.uniform(0.0, 2.0))
            d.kill()
        devices.stop.set()
        devices.join(180)
        assert not devices.is_alive(), "the devices did not finish"
        assert devices.error is None, devices.error
        d = Driver(url, queue, tmp_path, available_now=True)
        assert d.wait(240) == 0, "".join(d.lines[-40:])
        table = read_committed(tmp_path / "lake",
                               ["body", "topic", "qos", "headers", "properties"])
        assert table is not None
        rows = table.to_pylist()
        bodies = [r["body"].decode() for r in rows]
        want = {f"{name}:{i}" for j, name in enumerate(devices.names)
                for i in range(devices.acked[j])}
        assert len(bodies) == len(set(bodies)), \
            f"{len(bodies) - len(set(bodies))} messages landed twice (seed {seed})"
        missing = want - set(bodies)
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]} (seed {seed})"
        assert set(bodies) == want
        v5 = set(devices.names[1::2])
        for r in rows:
            name, i = r["body"].decode().split(":")
            assert r["topic"] == f"devices/{name}/temp", r
            assert r["qos"] == 1, r
            headers = dict(r["headers"])
            assert headers["x-mqtt-publish-qos"] == "1"
            if name in v5:
                assert headers["site"] == "lab" and headers["seq"] == i, r
                assert r["properties"]["content_type"] == "text/plain", r
                assert r["properties"]["correlation_id"] == f"c-{i}", r
                assert r["properties"]["reply_to"] == f"devices.{name}.reply", r
            else:
                assert "site" not in headers and r["properties"]["content_type"] is None, r
        deadline = time.monotonic() + 15
        while _queue_state(url, queue) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _queue_state(url, queue) == (0, 0)
    finally:
        devices.stop.set()
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_delete(queue)
        conn.close()


def docs_example() -> str:
    text = (DOCS / "mqtt.md").read_text()
    block = text.split("<!-- S11 example -->\n```python\n", 1)[1]
    return block.split("```\n<!-- end S11 example -->", 1)[0]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_S11_docs_example_devices_to_table(broker: BrokerProcess, spark: Any,
                                            tmp_path: Path) -> None:
    """docs/mqtt.md's devices → table example, run as written on this module's Spark
    session (its `getOrCreate()` returns it) with the broker's ports and the test's
    directory put in: the table holds each sensor's 100 readings once, on its topic, and
    the persistent session's queue is drained."""
    code = docs_example()
    amqp_port = broker.url.rsplit(":", 1)[1].split("/")[0]
    for old, new in (('connect("127.0.0.1", 1883)', f'connect("127.0.0.1", {broker.mqtt_port})'),
                     ("@127.0.0.1:5672/", f"@127.0.0.1:{amqp_port}/"),
                     ('"chk/', f'"{tmp_path}/chk/'), ('"lake/', f'"{tmp_path}/lake/')):
        assert old in code, old
        code = code.replace(old, new)
    exec(compile(code, "docs/mqtt.md", "exec"), {"__name__": "__docs__"})  # noqa: S102
    table = read_committed(tmp_path / "lake" / "readings", ["topic", "qos", "reading"])
    assert table is not None
    rows = sorted((r["topic"], r["reading"]) for r in table.to_pylist())
    want = sorted((f"devices/sensor-{n}/temp", f"{20 + i / 10:.1f}")
                  for n in range(3) for i in range(100))
    assert rows == want
    assert set(table.column("qos").to_pylist()) == {1}
    assert _queue_state(broker.url, "mqtt-subscription-lakeqos1")[0] == 0
