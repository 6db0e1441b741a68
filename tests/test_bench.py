"""`ackmq bench`: the statistics and A/B logic, and a tiny real run against a broker."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pika
import pytest

from ackmq.bench import cli
from ackmq.bench.pipeline import OutstandingConfirms
from ackmq.bench.progress import Progress
from ackmq.bench.report import summarize
from ackmq.bench.stats import median, percentile, ratio, schedule, verdict

# --- pure logic ----------------------------------------------------------------------


def test_median_odd_even_and_empty() -> None:
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert median([7]) == 7
    with pytest.raises(ValueError):
        median([])


def test_percentile_is_nearest_rank() -> None:
    xs = list(range(1, 1001))
    assert percentile(xs, 50) == 500
    assert percentile(xs, 99) == 990
    assert percentile(xs, 99.9) == 999
    assert percentile(xs, 100) == 1000
    assert percentile([5.0], 99.9) == 5.0


def test_ratio_and_verdict_direction() -> None:
    assert ratio(1, 2) == 0.5
    assert ratio(1, 0) is None
    # lower is better (ms): a ratio below 1 means A wins
    assert verdict(0.5, "lower", "ackmq", "rabbitmq") == "ackmq 2.00x better"
    assert verdict(2.0, "lower", "ackmq", "rabbitmq") == "rabbitmq 2.00x better"
    # higher is better (msgs/s): a ratio above 1 means A wins
    assert verdict(2.0, "higher", "ackmq", "rabbitmq") == "ackmq 2.00x better"
    assert verdict(0.25, "higher", "ackmq", "rabbitmq") == "rabbitmq 4.00x better"
    assert verdict(1.01, "higher", "a", "b") == "same"
    assert verdict(0.0, "lower", "a", "b") == "not comparable"


def test_schedule_alternates_brokers_within_each_workload() -> None:
    plan = schedule(["w1", "w2"], ["A", "B"], 3)
    assert [b for w, _, b in plan if w == "w1"] == ["A", "B", "A", "B", "A", "B"]
    assert [r for w, r, _ in plan if w == "w1"] == [0, 0, 1, 1, 2, 2]
    assert [w for w, _, _ in plan] == ["w1"] * 6 + ["w2"] * 6
    with pytest.raises(ValueError):
        schedule(["w"], ["A"], 0)


def _run(workload: str, broker: str, rnd: int, value: float, ok: bool = True) -> dict:
    return {"workload": workload, "broker": broker, "round": rnd, "ok": ok,
            "metrics": [{"name": workload, "value": value, "unit": "ms", "better": "lower"}],
            "wall_s": 2.0, "client_cpu_s": 1.0, "broker_cpu_s": 0.5, "messages": 10,
            "extra": {}}


def test_summarize_takes_medians_and_ratio_a_over_b() -> None:
    runs = [_run("w", "A", 0, 10), _run("w", "B", 0, 40), _run("w", "A", 1, 30),
            _run("w", "B", 1, 20), _run("w", "A", 2, 20), _run("w", "B", 2, 1000),
            _run("w", "A", 3, 1, ok=False)]  # failed runs do not count
    (row,) = summarize(runs, ["A", "B"])
    assert row["brokers"]["A"]["median"] == 20
    assert row["brokers"]["B"]["median"] == 40
    assert row["brokers"]["A"]["runs"] == 3
    assert row["ratio"] == 0.5 and row["ratio_of"] == "A/B"
    assert row["verdict"] == "A 2.00x better"
    assert row["brokers"]["A"]["client_cpu_pct"] == 50
    assert row["brokers"]["A"]["broker_cpu_pct"] == 25


def test_outstanding_confirms_multiple_single_and_nack() -> None:
    oc = OutstandingConfirms()
    for i in range(10):
        oc.add(i)
    oc.settle(3, multiple=True, ack=True)
    assert list(oc.pending) == [4, 5, 6, 7, 8, 9, 10]
    oc.settle(7, multiple=False, ack=False)
    assert oc.nacked == [6] and 7 not in oc.pending
    oc.settle(10, multiple=True, ack=True)
    assert not oc.pending and oc.acked == 9


def test_progress_plain_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    p = Progress(2, out)
    p.show("one")
    p.step()
    p.show("two")
    assert out.getvalue() == "[1/2] one\n[2/2] two\n"


def test_progress_overwrites_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p = Progress(2, out)
    p.show("a long line")
    p.step()
    p.show("short")
    assert "\n" not in out.getvalue()
    assert out.getvalue().count("\r") == 2


# --- a real, tiny run -----------------------------------------------------------------

TINY = ["confirms-individual", "confirms-batch", "confirms-async", "tx", "publish",
        "consume-auto", "consume-prefetch", "latency", "fanout"]


def _gone(url: str, names: list[str]) -> list[str]:
    """Names that still exist (passive declare succeeds) — should be none."""
    left = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for name in names:
            ch = conn.channel()
            try:
                if ".fanout." in name and not name.startswith("ackmq-bench.fanout.q"):
                    ch.exchange_declare(name, passive=True)
                else:
                    ch.queue_declare(name, passive=True)
                left.append(name)
                ch.close()
            except pika.exceptions.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
    finally:
        conn.close()
    return left


@pytest.mark.timeout(180)
def test_tiny_real_run_writes_json_and_png(broker_url: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    status = cli.main([*TINY, "--url", broker_url, "--messages", "200", "--rounds", "1",
                       "--rate", "2000", "--prefetch", "1,100,0",
                       "--json", str(out_json), "--plot", str(out_png)])
    printed = capsys.readouterr()
    data = json.loads(out_json.read_text())
    failed = [(r["workload"], r["error"]) for r in data["runs"] if not r["ok"]]
    assert status == 0, (failed, printed.out[-3000:])
    assert [r["workload"] for r in data["runs"]] == TINY
    assert all(r["messages"] == 200 for r in data["runs"])
    assert len(data["meta"]["brokers"]) == 1
    names = {m["name"] for r in data["runs"] for m in r["metrics"]}
    assert {"confirms-individual", "confirms-batch", "confirms-async", "tx/commit-each",
            "tx/commit-100", "publish", "consume-auto", "consume-prefetch/1",
            "consume-prefetch/100", "consume-prefetch/0", "latency/deliver-p50",
            "latency/deliver-p99", "latency/deliver-p99.9", "latency/confirm-p99",
            "fanout"} <= names
    assert all(m["value"] > 0 for r in data["runs"] for m in r["metrics"])
    floor = next(r for r in data["runs"] if r["workload"] == "confirms-individual")["extra"]
    assert floor["floor_ms"] > 0 and floor["rtt_us"] > 0
    rows = {(s["workload"], s["metric"]): s for s in data["summary"]}
    assert rows[("publish", "publish")]["brokers"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "== confirms-individual" in printed.out and "physical floor" in printed.out
    deleted = [n for r in data["runs"] for n in r["deleted"]]
    assert deleted and all(n.startswith("ackmq-bench.") for n in deleted)
    assert _gone(broker_url, deleted) == []


@pytest.mark.timeout(120)
def test_compare_alternates_and_reports_ratio(broker_url: str, tmp_path: Path) -> None:
    """The same broker as A and B: runs alternate A B A B and the ratio is A/B."""
    out_json = tmp_path / "ab.json"
    status = cli.main(["confirms-async", "--url", broker_url, "--compare", broker_url,
                       "--messages", "100", "--rounds", "2", "--json", str(out_json)])
    data = json.loads(out_json.read_text())
    assert status == 0, [r["error"] for r in data["runs"]]
    labels = [b["label"] for b in data["meta"]["brokers"]]
    assert len(labels) == 2 and labels[0] != labels[1]
    assert [r["broker"] for r in data["runs"]] == [labels[0], labels[1]] * 2
    (row,) = data["summary"]
    assert row["ratio_of"] == f"{labels[0]}/{labels[1]}"
    a, b = (row["brokers"][lb]["median"] for lb in labels)
    assert row["ratio"] == pytest.approx(a / b)


def test_unknown_workload_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nope", "--url", "amqp://guest:guest@127.0.0.1:1/"]) == 2
    assert "unknown workload" in capsys.readouterr().err


def test_rabbitmq_not_installed_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from ackmq.bench import brokers

    monkeypatch.setattr(brokers, "port_open", lambda host, port, timeout=0.5: False)
    monkeypatch.setattr(brokers.shutil, "which", lambda name: None)
    with pytest.raises(brokers.BenchSetupError, match="apt-get install rabbitmq-server"):
        brokers.local_rabbitmq()


@pytest.mark.timeout(120)
def test_T4_tx_workload_measures_commit_cost_against_confirms(broker_url: str,
                                                              tmp_path: Path) -> None:
    """T4 is a measurement: the tx workload reports commit-per-message and per-100 times
    and their cost against asynchronous confirms on the same broker."""
    out_json = tmp_path / "tx.json"
    status = cli.main(["tx", "confirms-async", "--url", broker_url, "--messages", "300",
                       "--rounds", "1", "--json", str(out_json)])
    data = json.loads(out_json.read_text())
    assert status == 0, [r["error"] for r in data["runs"]]
    metrics = {m["name"]: m["value"] for r in data["runs"] for m in r["metrics"]}
    each, per100 = metrics["tx/commit-each"], metrics["tx/commit-100"]
    assert each > 0 and per100 > 0
    assert metrics["confirms-async"] > 0
