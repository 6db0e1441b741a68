"""`python -m tools.perf.cpu` and `python -m tools.perf.scaling`: the per-message CPU
figure, the profile summary, the sweeps' report and the core pinning, on a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ackmq.bench.brokers import start_ackmq
from tools import python_env
from tools.perf.cpu import summarize, top_costs
from tools.perf.scaling import Point, pin, table


def test_top_costs_by_function_self_and_inclusive(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "main (a/x.py:1);parse (a/decoder.py:10);unpack (a/decoder.py:20) 6\n"
        "main (a/x.py:1);parse (a/decoder.py:11) 3\n"
        "main (a/x.py:2);route (a/vhost.py:5) 1\n")
    top = {fn: (own, incl) for fn, own, incl in top_costs(raw)}
    assert top["unpack decoder.py"] == (60.0, 60.0)
    assert top["parse decoder.py"] == (30.0, 90.0)  # two lines, one function
    assert top["route vhost.py"] == (10.0, 10.0)


def test_cpu_summary_ratio_is_ackmq_over_rabbitmq_of_medians() -> None:
    runs = [{"workload": "publish", "broker": b, "net_us": v, "raw_us": v}
            for b, v in (("ackmq", 5.0), ("ackmq", 7.0), ("ackmq", 6.0),
                         ("rabbitmq", 12.0), ("rabbitmq", 30.0), ("rabbitmq", 15.0))]
    line = summarize(runs, ["ackmq", "rabbitmq"]).splitlines()[1]
    assert "6.0 µs" in line and "15.0 µs" in line and line.endswith("0.40")


def test_scaling_table_rates_and_ratio() -> None:
    pts = [Point("queues", 10, "ackmq", 1000, 0.01, 0.005, 0.001),
           Point("queues", 10, "rabbitmq", 1000, 0.04, 0.02, 0.001)]
    row = table(pts, ["ackmq", "rabbitmq"]).splitlines()[2]
    assert row == "| queues | 10 | 100,000 | 5.0 | 25,000 | 20.0 | 4.00 |"


def test_cpu_bench_measures_broker_microseconds_per_message(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, "-m", "tools.perf.cpu", "--no-rabbitmq",
                           "--rounds", "1", "--scale", "0.2", "publish", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=python_env())
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["messages"] == 20_000 and run["broker"] == "ackmq"
    # 10 ms ticks over 20,000 publishes: a broker that did the work shows it
    assert 0.5 < run["raw_us"] < 500, run
    assert "publish" in proc.stdout.splitlines()[1]


def test_scaling_quick_sweep_writes_plot_and_json(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tools.perf.scaling", "consumers",
                           "--quick", "--no-rabbitmq", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=python_env())
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert [p["x"] for p in data["points"]] == [1, 10, 100]
    assert all(p["rate"] > 0 and p["messages"] == 20_000 for p in data["points"])
    assert (tmp_path / "scaling-consumers.png").stat().st_size > 10_000
    assert "consumers 100 on ackmq" in proc.stderr  # progress, one line per point


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to pin to one")
def test_pin_moves_every_broker_thread_and_back() -> None:
    target = start_ackmq()
    try:
        proc = target.process
        assert proc is not None
        pin(target, {0})
        assert {frozenset(os.sched_getaffinity(t.id)) for t in proc.threads()} == {
            frozenset({0})}
        every = set(range(os.cpu_count() or 1))
        pin(target, every)
        assert all(os.sched_getaffinity(t.id) == every for t in proc.threads())
    finally:
        target.close()
