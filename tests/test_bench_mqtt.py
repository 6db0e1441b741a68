"""`ackmq bench --mqtt` (issue 36): the MQTT rows run on ackmq's MQTT listener (the bench's
`ackmq serve` opens one on a free port) and, when they are listening, on Mosquitto 2.0
(127.0.0.1:1884) and RabbitMQ 3.10's plugin (127.0.0.1:1883) in the same run; tiny scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.mqtthelp import MOSQUITTO, RABBITMQ_MQTT
from support.net import need

from ackmq.bench import cli
from ackmq.bench.workloads import MQTT_WORKLOADS

N = 60
ROWS = ["mqtt-publish-qos0", "mqtt-publish-qos1", "mqtt-publish-qos1-window",
        "mqtt-publish-qos2", "mqtt-fanout"]


def _run(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int, dict, str]:
    out = tmp_path / "mqtt.json"
    status = cli.main(["--mqtt", *args, "--messages", str(N), "--rounds", "1",
                       "--json", str(out)])
    printed = capsys.readouterr().out
    return status, json.loads(out.read_text()), printed


def _figures(data: dict, label: str) -> dict[str, float]:
    runs = [r for r in data["runs"] if r["broker"] == label]
    bad = [(r["workload"], r["error"]) for r in runs if not r["ok"]]
    assert not bad, bad
    assert sorted(r["workload"] for r in runs) == sorted(ROWS)
    return {m["name"]: m["value"] for r in runs for m in r["metrics"]}


@pytest.mark.timeout(300)
def test_N3_mqtt_bench_rows_run_against_ackmq(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every MQTT row at a tiny scale against a started ackmq: each run ok, a rate for
    each, the subscribers' rows got every message once (the run checks), the QoS 2 row
    completed by PUBCOMP (nothing downgraded), and the session queues are gone after."""
    assert MQTT_WORKLOADS == ROWS
    status, data, printed = _run(["--ackmq"], tmp_path, capsys)
    assert status == 0, printed
    got = _figures(data, "ackmq")
    assert set(got) == set(ROWS)
    assert all(v > 0 for v in got.values()), got
    qos2 = next(r for r in data["runs"] if r["workload"] == "mqtt-publish-qos2")
    assert qos2["extra"] == {"session_qos": 2, "downgraded": 0}
    qos1 = next(r for r in data["runs"] if r["workload"] == "mqtt-publish-qos1")
    assert qos1["extra"]["session_qos"] == 1 and qos1["messages"] == N
    assert all(b["protocol"] == "mqtt" for b in data["meta"]["brokers"])
    for row in ROWS:
        assert f"== {row} (n={N})" in printed


@pytest.mark.rabbitmq
@pytest.mark.timeout(300)
def test_N3_mqtt_bench_rows_against_ackmq_mosquitto_and_rabbitmq(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The three brokers in one run: every row ok on each; RabbitMQ 3.10 grants QoS 1 for
    the QoS 2 subscription and answers each QoS 2 PUBLISH with a PUBACK (`downgraded`
    = n), Mosquitto completes them with PUBCOMP as ackmq does."""
    need(MOSQUITTO, "Mosquitto (/work/shared/tools/mosquitto-local start)")
    need(RABBITMQ_MQTT, "RabbitMQ's MQTT plugin")
    status, data, printed = _run(["--ackmq", "--mosquitto", "--rabbitmq-mqtt"], tmp_path,
                                 capsys)
    assert status == 0, printed
    assert [b["label"] for b in data["meta"]["brokers"]] == ["ackmq", "mosquitto", "rabbitmq"]
    for label in ("ackmq", "mosquitto", "rabbitmq"):
        _figures(data, label)
    qos2 = {r["broker"]: r["extra"] for r in data["runs"] if r["workload"] == "mqtt-publish-qos2"}
    assert qos2["ackmq"] == {"session_qos": 2, "downgraded": 0}
    assert qos2["mosquitto"] == {"session_qos": 2, "downgraded": 0}
    assert qos2["rabbitmq"] == {"session_qos": 1, "downgraded": N}
    assert "ratio ackmq/broker" in printed


@pytest.mark.parametrize("args, says", [
    (["--mosquitto"], "add --mqtt"),
    (["--stomp", "--rabbitmq-mqtt"], "add --mqtt (not --stomp)"),
    (["--mqtt", "--url", "amqp://127.0.0.1:5672/"], "MQTT workloads take MQTT brokers"),
    (["--mqtt", "--mqtt-url", "http://127.0.0.1:1/"], "unsupported scheme http://"),
    (["--mqtt", "--mqtt-url", "mqtt://127.0.0.1:1"], "cannot connect to mqtt://127.0.0.1:1"),
    (["--mqtt", "confirms-async"], "AMQP and MQTT workloads cannot share a run"),
    (["mqtt-fanout", "stomp-send-receipt"], "STOMP and MQTT workloads cannot share a run"),
])
def test_mqtt_setup_errors_are_one_line(args: list[str], says: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
