"""The operations-surface audit (SPEC M8, issue 28): ackmq's answers to the calls of
tools/audit/probes.py against RabbitMQ 3.10's, recorded in
tools/audit/rabbitmq-3.10.json (so this runs without RabbitMQ; the live half checks
that the recording is still what RabbitMQ answers, and is skipped without it).

A test fails on a difference that is neither fixed nor listed, with its reason, in
tools/audit/compare.py's KNOWN (documented in docs/management.md / docs/metrics.md),
and on a KNOWN entry that no longer matches any difference (a fix removes its entry).
The M1/M3 tests below are slices of the same audit, one per kind of fix.
"""

from __future__ import annotations

import datetime
import http.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from support.mgmthelp import rabbit_http

import ackmq
from tools.audit import compare, probes


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ackmq.EmbeddedBroker]:
    """With a data dir, as a deployment (its disk metrics need one)."""
    with ackmq.EmbeddedBroker(data_dir=tmp_path_factory.mktemp("audit")) as b:
        yield b


def _target(b: ackmq.EmbeddedBroker) -> probes.Target:
    return probes.Target("ackmq", b.http_url, b.http_url, b.port)


def _audit(b: ackmq.EmbeddedBroker, only: str | None = None) -> list[compare.Difference]:
    diffs = compare.differences(compare.load(), probes.run(_target(b), only))
    bad = compare.unexplained(diffs)
    assert not bad, "differences from RabbitMQ 3.10 neither fixed nor known:\n" + \
        "\n".join(map(str, bad))
    return diffs


def test_M8_operations_surface_matches_rabbitmq(broker: ackmq.EmbeddedBroker) -> None:
    diffs = _audit(broker)
    assert not compare.stale_known(diffs), "KNOWN entries that match nothing any more " \
        "(fixed: remove them and their lines in the docs)"
    recorded = compare.load()
    # the audit covers what issue 28 lists
    assert {f"property {n} (API)" for n in probes.PROPERTY_VALUES} <= set(recorded)
    assert sum(k.startswith("health ") for k in recorded) >= 20
    assert sum(k[:3] in ("400", "404") for k in recorded) >= 60
    assert "metrics /metrics/detailed?vhost=%2F&family=queue_coarse_metrics" in recorded


@pytest.mark.rabbitmq
def test_M8_the_recording_is_rabbitmqs_answer() -> None:
    """Live half: RabbitMQ answers now what the recording says (else re-record:
    `python -m tools.audit record`)."""
    rabbit_http()
    t = probes.Target("rabbitmq", probes_base(), "http://127.0.0.1:15692", 5672)
    try:
        got = probes.run(t)
    except OSError as e:  # the Prometheus port of a RabbitMQ without the plugin
        pytest.skip(f"RabbitMQ's management or Prometheus port not there: {e!r}")
    diffs = compare.differences(compare.load(), got)
    assert not diffs, "\n".join(map(str, diffs))


def probes_base() -> str:
    from support.mgmthelp import RABBIT_HTTP
    return RABBIT_HTTP


# -- slices of the audit, one per kind of fix (each fails without its fix) --------------
def test_M1_health_checks_as_rabbitmq(broker: ackmq.EmbeddedBroker) -> None:
    """Protocol aliases (amqp091, AMQP091, stomp1.2, management, amqps), the
    certificate-expiration window's texts, deprecated /api/healthchecks/node."""
    _audit(broker, r"^health ")


def test_M1_publish_properties_as_rabbitmq(broker: ackmq.EmbeddedBroker) -> None:
    """Every basic property through the API's publish and the UI's form; RabbitMQ's
    refusals (["not_int", "priority"], null_not_allowed, payload_not_string, …); unknown
    names ignored; no properties shown as []."""
    _audit(broker, r"^(property |400 publish)|UI publish")


def test_M1_error_reasons_as_rabbitmq(broker: ackmq.EmbeddedBroker) -> None:
    """404/400/401 codes and reasons: vhost_not_found on writes, a binding's missing
    end, failed_to_parse_json, tags_not_present, the get's encoding text, 'long'."""
    _audit(broker, r"^(40[014] )")


def test_M3_metrics_families_as_rabbitmq(broker: ackmq.EmbeddedBroker) -> None:
    _audit(broker, r"^metrics ")


def _scrape(b: ackmq.EmbeddedBroker, path: str) -> str:
    conn = http.client.HTTPConnection(b.http_url.split("//", 1)[1], timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        assert r.status == 200
        return r.read().decode()
    finally:
        conn.close()


def test_M3_metrics_detailed_families_and_vhost_filter(broker: ackmq.EmbeddedBroker
                                                       ) -> None:
    """RabbitMQ's semantics: no family, no object metrics; `family` and `vhost` repeat;
    values are the queue's."""
    assert _target(broker).call("PUT", "/api/vhosts/audit-detailed", {})[0] in (201, 204)
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare("audit-detailed-q")
        for _ in range(3):
            ch.basic_publish("", "audit-detailed-q", b"x")
        ch.queue_declare("audit-detailed-q")  # a round trip: the publishes are in
        bare = _scrape(broker, "/metrics/detailed")
        assert "rabbitmq_identity_info" in bare and "rabbitmq_detailed_" not in bare
        text = _scrape(broker, "/metrics/detailed?family=queue_coarse_metrics"
                               "&family=queue_consumer_count&vhost=%2F")
        # (prometheus_client writes the labels in name order)
        assert ('rabbitmq_detailed_queue_messages_ready{queue="audit-detailed-q",vhost="/"}'
                ' 3.0') in text
        assert 'rabbitmq_detailed_queue_consumers{queue="audit-detailed-q",vhost="/"} 0.0' \
            in text
        other = _scrape(broker, "/metrics/detailed?family=queue_coarse_metrics"
                                "&vhost=audit-detailed&family=vhost_status")
        assert "audit-detailed-q" not in other
        assert 'rabbitmq_cluster_vhost_status{vhost="audit-detailed"} 1.0' in other
        chans = _scrape(broker, "/metrics/detailed?family=channel_metrics"
                                "&family=connection_metrics")
        assert "rabbitmq_detailed_channel_consumers{channel=" in chans
        assert "rabbitmq_detailed_connection_channels{channel=" in chans
    finally:
        conn.close()


def test_M1_certificate_expiration_checks_the_tls_certificate(tmp_path: Path) -> None:
    """A TLS listener's certificate expiring within the window: 503, as RabbitMQ."""
    import trustme
    ca = trustme.CA()
    now = datetime.datetime.now(datetime.UTC)
    leaf = ca.issue_cert("localhost", "127.0.0.1", not_after=now + datetime.timedelta(days=10))
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    with ackmq.EmbeddedBroker(persistent=False, tls_port=0, tls_cert=cert, tls_key=key,
                              tls_ca=tmp_path / "ca.pem") as b:
        t = _target(b)
        status, body, _ = t.call("GET", "/api/health/checks/certificate-expiration/1/weeks")
        assert (status, body) == (200, {"status": "ok"})
        status, body, _ = t.call("GET", "/api/health/checks/certificate-expiration/2/weeks")
        assert status == 503, body
        assert body["status"] == "failed" and body["reason"] == "Certificates expiring"
        entry: dict[str, Any] = body["expired"][0]
        assert entry["protocol"] == "amqp/ssl" and entry["certfile"] == str(cert)
        assert entry["certfile_expires_on"].startswith(
            (now + datetime.timedelta(days=10)).strftime("%Y-%m-%d")[:7])


def _values(b: ackmq.EmbeddedBroker, path: str = "/metrics") -> dict[str, float]:
    out = {}
    for line in _scrape(b, path).splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_M3_churn_and_channel_counters(broker: ackmq.EmbeddedBroker) -> None:
    """RabbitMQ's churn counters and /metrics' channel message counters move with a
    client's connection, channel, queue and publish."""
    import time
    before = _values(broker)
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("audit-churn")
    ch.queue_declare("audit-churn")  # a redeclare: declared, not created
    ch.basic_publish("", "audit-churn", b"x")
    ch.queue_delete("audit-churn")
    conn.close()
    deadline = time.monotonic() + 30
    while True:  # the broker sees the close after the client
        after = _values(broker)
        if after["rabbitmq_connections_closed_total"] > \
                before["rabbitmq_connections_closed_total"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    delta = {k: after[k] - before[k] for k in before if k in after}
    assert delta["rabbitmq_connections_opened_total"] == 1
    assert delta["rabbitmq_connections_closed_total"] == 1
    assert delta["rabbitmq_channels_opened_total"] >= 1
    assert delta["rabbitmq_channels_closed_total"] >= 1
    assert delta["rabbitmq_queues_declared_total"] == 2
    assert delta["rabbitmq_queues_created_total"] == 1
    assert delta["rabbitmq_queues_deleted_total"] == 1
    assert delta["rabbitmq_channel_messages_published_total"] == 1
    detailed = _values(broker, "/metrics/detailed?family=connection_churn_metrics")
    assert detailed["rabbitmq_detailed_queues_created_total"] >= 1


def test_M3_global_publishers_and_consumers(broker: ackmq.EmbeddedBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare("audit-pubcons")
        ch.basic_consume("audit-pubcons", lambda *a: None)
        ch.basic_publish("", "audit-pubcons-none", b"x")
        ch.queue_declare("audit-pubcons")  # a round trip: the publish is in
        text = _scrape(broker, "/metrics")
        assert 'rabbitmq_global_consumers{protocol="amqp091"} 1.0' in text
        assert 'rabbitmq_global_publishers{protocol="amqp091"} 1.0' in text
        assert 'rabbitmq_global_publishers{protocol="stomp"} 0.0' in text
        ch.queue_delete("audit-pubcons")
    finally:
        conn.close()


def _labelled(b: ackmq.EmbeddedBroker, name: str, protocol: str) -> float:
    for line in _scrape(b, "/metrics").splitlines():
        if line.startswith(f'{name}{{protocol="{protocol}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_M3_auth_attempts(broker: ackmq.EmbeddedBroker) -> None:
    failed = _labelled(broker, "rabbitmq_auth_attempts_failed_total", "amqp091")
    ok = _labelled(broker, "rabbitmq_auth_attempts_succeeded_total", "amqp091")
    bad = broker.url.replace("guest:guest@", "guest:wrong@")
    with pytest.raises(pika.exceptions.AMQPError):
        pika.BlockingConnection(pika.URLParameters(bad))
    pika.BlockingConnection(pika.URLParameters(broker.url)).close()
    assert _labelled(broker, "rabbitmq_auth_attempts_failed_total", "amqp091") == failed + 1
    assert _labelled(broker, "rabbitmq_auth_attempts_succeeded_total", "amqp091") == ok + 1
    http_ok = _labelled(broker, "rabbitmq_auth_attempts_succeeded_total", "http")
    assert _target(broker).call("GET", "/api/whoami")[0] == 200
    assert _labelled(broker, "rabbitmq_auth_attempts_succeeded_total", "http") == http_ok + 1
    assert _labelled(broker, "rabbitmq_auth_attempts_total", "http") >= http_ok + 1


# every metric RabbitMQ's own Grafana dashboard "RabbitMQ-Overview" (rabbitmq-server,
# deps/rabbitmq_prometheus/docker/grafana/dashboards/RabbitMQ-Overview.json) queries
OVERVIEW_DASHBOARD = """
rabbitmq_identity_info rabbitmq_build_info rabbitmq_queue_messages_ready
rabbitmq_queue_messages_unacked rabbitmq_connections rabbitmq_channels rabbitmq_queues
rabbitmq_channel_consumers rabbitmq_channel_messages_published_total
rabbitmq_channel_messages_confirmed_total rabbitmq_channel_messages_unconfirmed
rabbitmq_queue_messages_published_total rabbitmq_channel_messages_unroutable_dropped_total
rabbitmq_channel_messages_unroutable_returned_total rabbitmq_channel_messages_delivered_total
rabbitmq_channel_messages_delivered_ack_total rabbitmq_channel_messages_redelivered_total
rabbitmq_channel_messages_acked_total rabbitmq_channel_get_total rabbitmq_channel_get_ack_total
rabbitmq_channel_get_empty_total rabbitmq_resident_memory_limit_bytes
rabbitmq_process_resident_memory_bytes rabbitmq_disk_space_available_bytes
rabbitmq_process_max_fds rabbitmq_process_open_fds rabbitmq_process_max_tcp_sockets
rabbitmq_process_open_tcp_sockets rabbitmq_queues_declared_total rabbitmq_queues_created_total
rabbitmq_queues_deleted_total rabbitmq_channels_opened_total rabbitmq_channels_closed_total
rabbitmq_connections_opened_total rabbitmq_connections_closed_total
""".split()


def test_M3_rabbitmq_overview_dashboard_is_served(broker: ackmq.EmbeddedBroker) -> None:
    served = set(probes.metric_families(_scrape(broker, "/metrics")))
    missing = [m for m in OVERVIEW_DASHBOARD
               if m not in served and m.removesuffix("_total") not in served]
    assert not missing


def test_M1_node_churn_counts(broker: ackmq.EmbeddedBroker) -> None:
    """/api/nodes has RabbitMQ 3.10's churn keys (connection_created … queue_deleted,
    each with `_details`) and fd_used, counting as the churn metrics do."""
    t = _target(broker)
    before = t.call("GET", "/api/nodes")[1][0]
    pika.BlockingConnection(pika.URLParameters(broker.url)).close()
    after = t.call("GET", "/api/nodes")[1][0]
    for key in ("connection_created", "connection_closed", "channel_created",
                "channel_closed", "queue_declared", "queue_created", "queue_deleted",
                "fd_used"):
        assert key in after and after[f"{key}_details"] == {"rate": 0.0}, key
    assert after["connection_created"] == before["connection_created"] + 1
    assert after["fd_used"] > 0


def test_M1_connection_tls_keys(tmp_path: Path) -> None:
    """A connection's ssl_* and peer_cert_* keys: null on a plain connection (as
    RabbitMQ), filled on a TLS one with a client certificate."""
    import time

    import trustme
    from test_tls import client_params
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    cert, key, cafile = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(cafile))
    with ackmq.EmbeddedBroker(persistent=False, tls_port=0, tls_cert=cert, tls_key=key,
                              tls_ca=cafile, tls_verify_peer=True) as b:
        plain = pika.BlockingConnection(pika.URLParameters(b.url))
        tls_port = int(b.tls_url.rsplit(":", 1)[1].split("/")[0])
        secure = pika.BlockingConnection(client_params(tls_port, ca, cert_for="audit-client"))
        try:
            t = _target(b)
            deadline = time.monotonic() + 30
            while len(conns := t.call("GET", "/api/connections")[1]) < 2 \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            by_tls = {c["ssl"]: c for c in conns}
            assert by_tls[False]["ssl_protocol"] is None
            assert by_tls[False]["peer_cert_subject"] is None
            c = by_tls[True]
            assert c["ssl_protocol"].startswith("tlsv1."), c["ssl_protocol"]
            assert c["ssl_cipher"] and c["peer_cert_subject"].startswith("CN=audit-client,")
            assert c["peer_cert_issuer"] and " - " in c["peer_cert_validity"]
        finally:
            plain.close()
            secure.close()
