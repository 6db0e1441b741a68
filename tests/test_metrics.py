"""M3: /metrics in Prometheus text, RabbitMQ's names where one exists, parsed with
prometheus_client's parser; the shared names compared with the running RabbitMQ's
(its prometheus plugin on 15692) when it is there."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

import ackmq

RABBIT_PROMETHEUS = os.environ.get("ACKMQ_RABBITMQ_PROMETHEUS", "http://127.0.0.1:15692")

# the names the issue lists: both brokers must have them, with the same type and labels
SHARED = ("rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
          "rabbitmq_queue_messages", "rabbitmq_queue_consumers", "rabbitmq_connections",
          "rabbitmq_channels", "rabbitmq_queues", "rabbitmq_consumers",
          "rabbitmq_global_messages_received", "rabbitmq_global_messages_received_confirm",
          "rabbitmq_global_messages_confirmed", "rabbitmq_global_messages_routed",
          "rabbitmq_global_messages_unroutable_dropped",
          "rabbitmq_global_messages_delivered", "rabbitmq_global_messages_acknowledged",
          "rabbitmq_global_messages_redelivered", "rabbitmq_process_resident_memory_bytes",
          "rabbitmq_resident_memory_limit_bytes", "rabbitmq_disk_space_available_bytes",
          "rabbitmq_alarms_memory_used_watermark",
          "rabbitmq_alarms_free_disk_space_watermark")


def fetch(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str, **labels: str) -> float:
    """A sample by its name (a family's, its `_total`, or a histogram's `_count`...)."""
    for fam in fams.values():
        for s in fam.samples:
            if s.name in (name, name + "_total") and all(s.labels.get(k) == v
                                                         for k, v in labels.items()):
                return s.value
    raise KeyError(f"{name} {labels}")


def label_names(fam: Any) -> set[str]:
    """The labels of a family's plain samples (not a histogram's `le`)."""
    return {k for s in fam.samples for k in s.labels if k != "le"}


def ctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ackmq.EmbeddedBroker]:
    data = tmp_path_factory.mktemp("metrics")
    with ackmq.EmbeddedBroker(data_dir=data) as b:
        b.data_dir = data  # type: ignore[attr-defined]
        yield b


def test_M3_metrics_counts_what_clients_did(broker: ackmq.EmbeddedBroker) -> None:
    before = families(fetch(broker.http_url + "/metrics")[2])
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        q = "m3-count"
        ch.queue_declare(q, durable=True)
        for _ in range(10):
            ch.basic_publish("", q, b"x", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "m3-nowhere", b"x")  # unroutable, dropped
        method, _, _ = ch.basic_get(q)
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, _, _ = ch.basic_get(q)  # the same message, redelivered
        assert method.redelivered
        ch.basic_ack(method.delivery_tag)
        ch2 = conn.channel()  # a second channel, left open while scraping
        status, ctype, text = fetch(broker.http_url + "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        after = families(text)

        def delta(name: str, **labels: str) -> float:
            return value(after, name, **labels) - value(before, name, **labels)

        amqp = {"protocol": "amqp091"}
        assert delta("rabbitmq_global_messages_received", **amqp) == 11
        assert delta("rabbitmq_global_messages_received_confirm", **amqp) == 11
        assert delta("rabbitmq_global_messages_confirmed", **amqp) == 11
        assert delta("rabbitmq_global_messages_routed", **amqp) == 10
        assert delta("rabbitmq_global_messages_unroutable_dropped", **amqp) == 1
        assert delta("rabbitmq_global_messages_delivered", **amqp) == 2
        assert delta("rabbitmq_global_messages_delivered_get_manual_ack", **amqp) == 2
        assert delta("rabbitmq_global_messages_redelivered", **amqp) == 1
        assert delta("rabbitmq_global_messages_acknowledged", **amqp) == 1
        assert value(after, "rabbitmq_queue_messages_ready") == 9
        assert value(after, "rabbitmq_queue_messages") == 9
        assert value(after, "rabbitmq_queues") == 1
        assert value(after, "rabbitmq_connections") == 1
        assert value(after, "rabbitmq_channels") == 2
        assert ch2.is_open
        # ackmq's own: 10 persistent publishes waited for an fdatasync
        assert delta("ackmq_confirm_latency_seconds_count") == 10
        assert delta("ackmq_fdatasync_seconds_count") >= 1
        assert after["ackmq_fdatasync_seconds"].type == "histogram"
        assert after["ackmq_fdatasync_records"].type == "histogram"
        assert value(after, "ackmq_fdatasync_records_sum") >= 10
        per = families(fetch(broker.http_url + "/metrics/per-object")[2])
        assert value(per, "rabbitmq_queue_messages_ready", vhost="/", queue=q) == 9
        assert value(per, "ackmq_queue_messages_published", vhost="/", queue=q) == 10
        ch.queue_delete(q)
    finally:
        conn.close()


def test_M3_metrics_need_no_login(broker: ackmq.EmbeddedBroker) -> None:
    """A Prometheus scrape carries no credentials; the API next to it still wants them."""
    assert fetch(broker.http_url + "/metrics")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as e:
        fetch(broker.http_url + "/api/overview")
    assert e.value.code == 401


def test_M3_alarm_metric_follows_set_vm_memory_high_watermark(
        broker: ackmq.EmbeddedBroker) -> None:
    data = broker.data_dir  # type: ignore[attr-defined]
    assert ctl(data, "set_vm_memory_high_watermark", "0.0000001").returncode == 0
    try:
        deadline = time.monotonic() + 10
        while True:
            fams = families(fetch(broker.http_url + "/metrics")[2])
            if value(fams, "rabbitmq_alarms_memory_used_watermark") == 1:
                break
            assert time.monotonic() < deadline, "the memory alarm never showed"
            time.sleep(0.1)
        assert value(fams, "rabbitmq_resident_memory_limit_bytes") < 4096
    finally:
        assert ctl(data, "set_vm_memory_high_watermark", "0.4").returncode == 0
    deadline = time.monotonic() + 10
    while value(families(fetch(broker.http_url + "/metrics")[2]),
                "rabbitmq_alarms_memory_used_watermark") != 0:
        assert time.monotonic() < deadline, "the memory alarm never cleared"
        time.sleep(0.1)


def _rabbit(path: str) -> dict[str, Any]:
    try:
        return families(fetch(RABBIT_PROMETHEUS + path)[2])
    except OSError as e:
        pytest.skip(f"no RabbitMQ prometheus endpoint at {RABBIT_PROMETHEUS} ({e!r}); "
                    "rabbitmq-plugins enable rabbitmq_prometheus")


@pytest.mark.rabbitmq
@pytest.mark.parametrize("path", ["/metrics", "/metrics/per-object"])
def test_M3_metric_names_types_labels_as_rabbitmq(broker: ackmq.EmbeddedBroker,
                                                    path: str) -> None:
    """Every rabbitmq_* family ackmq serves exists in RabbitMQ's scrape of the same path
    with the same type and label names; the issue's list is in both."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:  # a queue and a connection, so that per-object families have samples
        conn.channel().queue_declare("m3-names", auto_delete=False)
        ours = families(fetch(broker.http_url + path)[2])
        conn.channel().queue_delete("m3-names")
    finally:
        conn.close()
    theirs = _rabbit(path)
    shared = [n for n in SHARED if "alarms" not in n or path == "/metrics"]
    missing = [n for n in shared if n not in ours or n not in theirs]
    assert not missing, f"not in both: {missing}"
    for name, fam in ours.items():
        if not name.startswith("rabbitmq_"):
            continue
        assert name in theirs, f"{name}: RabbitMQ has no such metric on {path}"
        assert fam.type == theirs[name].type, (name, fam.type, theirs[name].type)
        if theirs[name].samples and fam.samples:
            assert label_names(fam) == label_names(theirs[name]), name


def test_M3_prometheus_port_of_its_own() -> None:
    """`--prometheus-port` (RabbitMQ's 15692): /metrics alone, no login, nothing else."""
    from ackmq.server.http.metrics import PROMETHEUS_KEY
    with ackmq.EmbeddedBroker(persistent=False, prometheus_port=0) as b:
        prom = b.server.http._runner.app[PROMETHEUS_KEY]
        assert prom.port and prom.port != b.http_port
        status, ctype, text = fetch(prom.url + "/metrics")
        assert status == 200 and "rabbitmq_queues" in families(text)
        assert "rabbitmq_queue_messages_ready" in families(
            fetch(prom.url + "/metrics/per-object")[2])
        with pytest.raises(urllib.error.HTTPError) as e:
            fetch(prom.url + "/api/overview")
        assert e.value.code == 404


def test_M3_stomp_counts_under_its_protocol(broker: ackmq.EmbeddedBroker) -> None:
    """A STOMP SEND is a publish of protocol "stomp", its MESSAGE a delivery."""
    import stomp
    before = families(fetch(broker.http_url + "/metrics")[2])
    conn = stomp.Connection12([("127.0.0.1", broker.stomp_port)])
    conn.connect("guest", "guest", wait=True)
    try:
        conn.send("/queue/m3-stomp", "hello", receipt="r1")
        deadline = time.monotonic() + 10
        while True:
            after = families(fetch(broker.http_url + "/metrics")[2])
            got = (value(after, "rabbitmq_global_messages_received", protocol="stomp")
                   - value(before, "rabbitmq_global_messages_received", protocol="stomp"))
            if got == 1:
                break
            assert time.monotonic() < deadline, "the STOMP SEND was never counted"
            time.sleep(0.1)
        assert (value(after, "rabbitmq_global_messages_received", protocol="amqp091")
                == value(before, "rabbitmq_global_messages_received", protocol="amqp091"))
    finally:
        conn.disconnect()


def test_M3_per_object_labels_escaped(broker: ackmq.EmbeddedBroker) -> None:
    """Queue names with quotes, backslashes and newlines come back intact."""
    odd = 'm3-"quoted"\\back\nslash'
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(odd)
        ch.basic_publish("", odd, b"x")
        per = families(fetch(broker.http_url + "/metrics/per-object")[2])
        assert value(per, "rabbitmq_queue_messages_ready", vhost="/", queue=odd) == 1
        assert value(per, "ackmq_queue_messages_published", vhost="/", queue=odd) == 1
        ch.queue_delete(odd)
    finally:
        conn.close()
