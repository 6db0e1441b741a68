"""`ackmq bench stream-publish stream-consume` (issue 37): the stream protocol's rows run
on ackmq's own stream listener (the bench's `ackmq serve` opens one on a free port) and
on RabbitMQ's stream plugin (5552) in the same run, when named; not in the default set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import rabbitmq_url

from ackmq.bench import cli
from ackmq.bench.workloads import AMQP_WORKLOADS

NAMES = ["stream-publish", "stream-consume"]


@pytest.mark.timeout(300)
def test_X1_stream_bench_rows_against_ackmq_and_rabbitmq(tmp_path: Path) -> None:
    rabbitmq_url()  # skips without the reference broker
    assert not set(NAMES) & set(AMQP_WORKLOADS)
    out_json = tmp_path / "stream.json"
    status = cli.main([*NAMES, "--ackmq", "--rabbitmq", "--messages", "500", "--rounds",
                       "1", "--json", str(out_json)])
    data = json.loads(out_json.read_text())
    assert status == 0, [r["error"] for r in data["runs"]]
    runs = data["runs"]
    assert {(r["workload"], m["name"]) for r in runs for m in r["metrics"]} == \
        {(n, n) for n in NAMES}
    assert len(runs) == 4  # both workloads on both brokers
    assert all(m["value"] > 0 for r in runs for m in r["metrics"])
    assert all(r["extra"].get("consumed", 500) >= 500 for r in runs)
