"""`ackmq bench`: the statistics and A/B logic, and a tiny real run against a broker."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from ackmq.bench import cli, floor, report
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
    assert "median of 1 run;" in printed.out
    assert data["meta"]["physical_floor"]["fdatasync_us"] == floor["fdatasync_us"]
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


# --- the physical floor: medians of all runs, measured honestly, tmpfs named ------------


def _floor_run(broker: str, rnd: int, sync_us: float, rtt_us: float = 20.0, *,
               in_data_dir: bool = False, fstype: str = "ext4", mount: str = "/",
               floor_dir: str = "/var/tmp") -> dict:
    run = _run("confirms-individual", broker, rnd, 400.0)
    run["messages"] = 1000
    run["extra"] = {"rtt_us": rtt_us, "fdatasync_us": sync_us, "fdatasync_append_us": 2 * sync_us,
                    "floor_in_data_dir": in_data_dir, "floor_dir": floor_dir,
                    "floor_mount": mount, "floor_fstype": fstype}
    return run


def test_floor_is_the_median_of_all_runs_not_one_outlier() -> None:
    """Issue 4 audit: one 3,242 µs fdatasync in the first run set the printed floor."""
    runs = [_floor_run("A", 0, 3242, 30, in_data_dir=True), _floor_run("B", 0, 109, 10),
            _floor_run("A", 1, 151, 20, in_data_dir=True), _floor_run("B", 1, 120, 40),
            _floor_run("A", 2, 130, 25, in_data_dir=True), _floor_run("B", 2, 140, 15)]
    f = report.floor_summary(runs)
    assert f is not None
    assert f["fdatasync_us"] == 135 and f["rtt_us"] == 22.5  # medians of six, separately
    assert f["fdatasync_runs"] == f["rtt_runs"] == 6
    assert f["floor_ms"] == pytest.approx(1000 * (22.5 + 135) / 1e3)
    table = report.format_table(report.summarize(runs, ["A", "B"]), runs, ["A", "B"])
    assert "fdatasync 135 µs" in table and "median of 6 runs" in table
    assert "3242" not in table and "WARNING" not in table


def test_floor_does_not_mix_filesystems_and_warns_on_tmpfs() -> None:
    runs = [_floor_run("A", 0, 100, in_data_dir=True, floor_dir="/data/x", mount="/data"),
            _floor_run("B", 0, 1, fstype="tmpfs", mount="/tmp", floor_dir="/tmp"),
            _floor_run("A", 1, 300, in_data_dir=True, floor_dir="/data/x", mount="/data")]
    f = report.floor_summary(runs)
    assert f is not None and f["fdatasync_us"] == 200 and f["fdatasync_runs"] == 2
    assert f["rtt_runs"] == 3
    table = report.format_table(report.summarize(runs, ["A", "B"]), runs, ["A", "B"])
    assert "medians of 3 runs (rtt) and 2 (fdatasync)" in table and "WARNING" not in table
    tmp = [_floor_run("B", 0, 1, fstype="tmpfs", mount="/tmp", floor_dir="/tmp")]
    table = report.format_table(report.summarize(tmp, ["B"]), tmp, ["B"])
    assert "WARNING: /tmp is on tmpfs" in table and "--data-dir" in table


def test_filesystem_of_takes_the_longest_mount_prefix() -> None:
    mounts = ("/dev/vda / ext4 rw 0 0\n"
              "tmpfs /tmp tmpfs rw 0 0\n"
              "/dev/vdb /mnt/my\\040disk xfs rw 0 0\n"
              "tmpfs /var/tmp tmpfs rw 0 0\n"
              "/dev/vdc /var/tmp ext4 rw 0 0\n")  # mounted over: the last line wins
    assert floor.filesystem_of("/tmp/x/y", mounts) == ("/tmp", "tmpfs")
    assert floor.filesystem_of("/tmpfoo", mounts) == ("/", "ext4")  # a prefix of a name
    assert floor.filesystem_of("/mnt/my disk/q", mounts) == ("/mnt/my disk", "xfs")
    assert floor.filesystem_of("/var/tmp/a", mounts) == ("/var/tmp", "ext4")
    assert floor.filesystem_of("/", mounts) == ("/", "ext4")


def test_physical_floor_measures_both_writes_and_names_the_filesystem(tmp_path: Path) -> None:
    f = floor.physical_floor(100, str(tmp_path))
    assert f["rtt_us"] > 0 and f["fdatasync_us"] > 0 and f["fdatasync_append_us"] > 0
    assert f["floor_ms"] == pytest.approx(100 * (f["rtt_us"] + f["fdatasync_us"]) / 1e3)
    assert (f["floor_mount"], f["floor_fstype"]) == floor.filesystem_of(str(tmp_path))
    assert f["floor_fstype"] != "unknown" and f["floor_dir"] == str(tmp_path)
    assert list(tmp_path.iterdir()) == []  # its scratch files are gone
    assert floor.floor_dir(None) == "/var/tmp"  # not /tmp, which is often tmpfs
    shm = Path("/dev/shm")
    if shm.is_dir() and floor.filesystem_of(str(shm))[1] == "tmpfs":
        assert floor.physical_floor(10, str(shm))["floor_fstype"] == "tmpfs"


# --- CPU below the tick resolution ---------------------------------------------------


def test_broker_cpu_below_tick_resolution_is_marked_not_printed() -> None:
    fine = [_run("w", "A", 0, 1.0), _run("w", "A", 1, 1.0)]
    noisy = [_run("w", "B", 0, 1.0), _run("w", "B", 1, 1.0)]
    noisy[1]["broker_cpu_s"] = 0.01  # one 10 ms tick: 0.5% of 2 s, or 0%, or 1%: noise
    (row,) = report.summarize(fine + noisy, ["A", "B"])
    assert row["brokers"]["A"]["broker_cpu_pct"] == 25
    assert not row["brokers"]["A"]["broker_cpu_below_resolution"]
    assert row["brokers"]["B"]["broker_cpu_pct"] is None
    assert row["brokers"]["B"]["broker_cpu_below_resolution"]
    table = report.format_table([row], fine + noisy, ["A", "B"])
    b_line = next(line for line in table.splitlines() if line.split()[:1] == ["B"])
    assert "<res" in b_line and "50% / <res" in b_line
    assert "<res = " in table


# --- bad URLs: one line, exit 2, no traceback -------------------------------------------


@pytest.mark.parametrize(("url", "says"), [
    ("http://x", "unsupported scheme http://"),
    ("amqps://guest:guest@127.0.0.1:5671/", "amqps:// (TLS) is not supported by the bench"),
    ("notaurl", "not a broker URL"),
    ("amqp:notaurl", "not a broker URL"),
    ("amqp://guest:secret@127.0.0.1:notaport/", "Port could not be cast"),
    ("amqp://127.0.0.1:99999/", "out of range"),
])
def test_bad_url_is_one_clear_line_and_exit_2(url: str, says: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--url", "--compare"):
        args = ["confirms-async", flag, url]
        if flag == "--compare":
            args += ["--url", "amqp://guest:guest@127.0.0.1:1/"]
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert says in err and f"{flag}:" in err
        assert "amqp://user:pass@host:port/vhost" in err
        assert "Traceback" not in err and "secret" not in err


def test_bad_url_through_the_ackmq_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "ackmq", "bench", "--url", "http://x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ackmq bench: --url: unsupported scheme http:// in 'http://x'; expected "
        "amqp://user:pass@host:port/vhost (e.g. amqp://guest:guest@127.0.0.1:5672/)"]


# --- --rabbitmq: what answers must be RabbitMQ; a failed start is a message -------------


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_rabbitmq_flag_refuses_another_broker_on_its_port(
        broker_url: str, is_rabbitmq: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ackmq.bench import brokers

    if is_rabbitmq:
        pytest.skip("the broker under test is a RabbitMQ")
    monkeypatch.setattr(brokers, "RABBITMQ_URL", broker_url)  # "5672" is an ackmq here
    assert cli.main(["confirms-async", "--rabbitmq", "--messages", "10"]) == 2
    err = capsys.readouterr().err
    assert "not RabbitMQ" in err and "ackmq" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_rabbitmq_flag_refuses_a_non_amqp_listener() -> None:
    from ackmq.bench import brokers

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def http() -> None:
        for _ in range(4):
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                c.recv(64)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    t = threading.Thread(target=http, daemon=True)
    t.start()
    try:
        port = srv.getsockname()[1]
        with pytest.raises(brokers.BenchSetupError,
                           match=f"something listens on 127.0.0.1:{port} .*but no RabbitMQ"):
            brokers.local_rabbitmq(url=f"amqp://guest:guest@127.0.0.1:{port}/")
    finally:
        srv.close()


def test_rabbitmq_failed_start_is_a_message_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ackmq.bench import brokers

    fake = tmp_path / "rabbitmq-server"
    fake.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(brokers, "RABBITMQ_URL", f"amqp://guest:guest@127.0.0.1:{_closed_port()}/")
    assert cli.main(["confirms-async", "--rabbitmq", "--messages", "10"]) == 2
    err = capsys.readouterr().err
    assert "-detached` failed (exit status 3)" in err and str(fake) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_rabbitmq_flag_accepts_the_real_rabbitmq() -> None:
    from ackmq.bench import brokers

    if not brokers.port_open("127.0.0.1", 5672):
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    target = brokers.local_rabbitmq()
    try:
        assert "rabbitmq" in target.product.lower() and target.label == "rabbitmq"
    finally:
        target.close()


# --- STOMP: `ackmq bench --stomp` -------------------------------------------------------

STOMP_N = 150
STOMP_METRICS = {"stomp-send-receipt", "stomp-send-stream", "stomp-consume-ci/1",
                 "stomp-consume-ci/100", "stomp-consume-auto"}


@pytest.fixture(scope="module")
def embedded_stomp() -> Iterator[tuple[str, str]]:
    """An embedded ackmq (fsync on): its (amqp url, stomp url)."""
    from ackmq import EmbeddedBroker

    broker = EmbeddedBroker()
    url = broker.start()
    try:
        yield url, broker.stomp_url
    finally:
        broker.stop()


def _stomp_run(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
               ) -> tuple[int, dict, str]:
    out_json = tmp_path / "stomp.json"
    status = cli.main(["--stomp", *args, "--messages", str(STOMP_N), "--rounds", "1",
                       "--stomp-prefetch", "1,100", "--json", str(out_json)])
    printed = capsys.readouterr().out
    return status, json.loads(out_json.read_text()), printed


def _check_stomp_figures(data: dict, labels: list[str]) -> None:
    """Every run ok, n messages each, every message received exactly once, sane values."""
    runs = data["runs"]
    failed = [(r["workload"], r["broker"], r["error"]) for r in runs if not r["ok"]]
    assert not failed, failed
    assert [r["broker"] for r in runs if r["workload"] == "stomp-send-receipt"] == labels
    assert [r["workload"] for r in runs][::len(labels)] == [
        "stomp-send-receipt", "stomp-send-stream", "stomp-consume-ci", "stomp-consume-auto"]
    assert all(r["messages"] == STOMP_N for r in runs)
    for r in runs:  # the send workloads drain their queue afterwards: each message once
        if r["workload"].startswith("stomp-send"):
            assert r["extra"]["received_once"] == STOMP_N, r
    for label in labels:
        got = {m["name"]: m["value"] for r in runs if r["broker"] == label for m in r["metrics"]}
        assert set(got) == STOMP_METRICS, got
        assert all(v > 0 for v in got.values())
        assert got["stomp-send-receipt"] < 60_000  # ms for 150 receipts: sane, not stuck
        assert got["stomp-consume-ci/100"] > 50    # msgs/s
    rows = {s["metric"]: s for s in data["summary"]}
    assert set(rows) == STOMP_METRICS
    for row in rows.values():
        assert [x["of"] for x in row["ratios"]] == [f"{labels[0]}/{b}" for b in labels[1:]]
        for x in row["ratios"]:
            a, b = row["brokers"][labels[0]]["median"], row["brokers"][x["against"]]["median"]
            assert x["ratio"] == pytest.approx(a / b)
    assert all(b["protocol"] == "stomp" for b in data["meta"]["brokers"])


@pytest.mark.timeout(180)
def test_stomp_tiny_run_started_and_embedded_ackmq(embedded_stomp: tuple[str, str],
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """--ackmq (started with STOMP on a free port) against an embedded ackmq, A B."""
    amqp_url, stomp_url = embedded_stomp
    status, data, printed = _stomp_run(["--ackmq", "--stomp-url", stomp_url,
                                        "--plot", str(tmp_path / "s.png")], tmp_path, capsys)
    labels = [b["label"] for b in data["meta"]["brokers"]]
    assert labels == ["ackmq-A", "ackmq-B"]
    assert status == 0, printed[-3000:]
    _check_stomp_figures(data, labels)
    assert "== stomp-consume-ci" in printed and "ratio ackmq-A/ackmq-B" in printed
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a --stomp-url target has no AMQP URL: its queues are drained, not deleted, and say so
    left = [n for r in data["runs"] if r["broker"] == "ackmq-B" for n in r["left_empty"]]
    assert len(left) == 1 + 1 + 2 + 1  # one queue per send workload and per prefetch value
    assert not [n for r in data["runs"] if r["broker"] == "ackmq-B" for n in r["deleted"]]
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        assert all(conn.channel().queue_declare(q, passive=True).method.message_count == 0
                   for q in left)
    finally:
        conn.close()
    assert all(n.startswith("ackmq-bench.stomp-") for r in data["runs"] if r["broker"] == "ackmq-A"
               for n in r["deleted"])


@pytest.mark.timeout(240)
def test_stomp_three_brokers_with_rabbitmq(embedded_stomp: tuple[str, str], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A B C alternating: ackmq, a second ackmq and RabbitMQ's STOMP plugin; A/B and A/C."""
    from ackmq.bench import brokers

    if not brokers.port_open("127.0.0.1", 61623):
        pytest.skip("RabbitMQ's STOMP plugin is not reachable at 127.0.0.1:61623 "
                    "(start it with ../shared/tools/rabbitmq-local start)")
    status, data, printed = _stomp_run(["--ackmq", "--stomp-url", embedded_stomp[1],
                                        "--rabbitmq-stomp"], tmp_path, capsys)
    labels = [b["label"] for b in data["meta"]["brokers"]]
    assert labels == ["ackmq-A", "ackmq-B", "rabbitmq"]
    assert status == 0, printed[-3000:]
    _check_stomp_figures(data, labels)
    assert "ratio ackmq-A/broker" in printed
    rabbit = next(b for b in data["meta"]["brokers"] if b["label"] == "rabbitmq")
    assert rabbit["product"] == "RabbitMQ" and rabbit["version"]
    deleted = [n for r in data["runs"] if r["broker"] == "rabbitmq" for n in r["deleted"]]
    assert deleted and _gone(brokers.RABBITMQ_URL, deleted) == []


def test_stomp_summary_ratios_of_a_to_each_other_broker() -> None:
    runs = [_run("w", "A", 0, 10), _run("w", "B", 0, 20), _run("w", "C", 0, 5)]
    (row,) = summarize(runs, ["A", "B", "C"])
    assert row["ratio_of"] == "A/B" and row["ratio"] == 0.5
    assert [(x["of"], x["ratio"], x["verdict"]) for x in row["ratios"]] == [
        ("A/B", 0.5, "A 2.00x better"), ("A/C", 2.0, "C 2.00x better")]
    table = report.format_table([row], runs, ["A", "B", "C"])
    lines = {ln.split()[0] if ln.split()[0] in "BC" else ln.split()[1]: ln
             for ln in table.splitlines() if ln.startswith("  ") and len(ln.split()) > 2}
    assert "A 2.00x better" in lines["B"] and "C 2.00x better" in lines["C"]


def test_stomp_tally_catches_loss_and_duplicates() -> None:
    from ackmq.bench.stomp_load import _body, _Tally

    t = _Tally(3)
    for i in (0, 1, 1):
        t.add(_body(i, 100))
    with pytest.raises(RuntimeError, match="2 of 3 messages received, 1 duplicates"):
        t.check("x")
    t.add(_body(2, 100))
    t.duplicates = 0
    t.check("x")


@pytest.mark.parametrize(("args", "says"), [
    (["--stomp", "--stomp-url", "amqp://127.0.0.1:5672/"], "unsupported scheme amqp://"),
    (["--stomp", "--url", "amqp://127.0.0.1:5672/"], "STOMP workloads take STOMP brokers"),
    (["--activemq"], "add --stomp"),
    (["--stomp", "confirms-async", "--stomp-url", "stomp://127.0.0.1:1/"],
     "cannot share a run"),
])
def test_stomp_setup_errors_are_one_line(args: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_stomp_reference_not_running_says_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from ackmq.bench import brokers

    port = _closed_port()
    with pytest.raises(brokers.BenchSetupError, match="activemq-local start"):
        brokers.activemq(f"stomp://guest:guest@127.0.0.1:{port}/")


@pytest.mark.timeout(180)
def test_amqp10_workloads_tiny_run(broker_url: str, tmp_path: Path) -> None:
    """The AMQP 1.0 rows (issue 29) run against the same AMQP port, when named; not in
    the default set (a 0-9-1-only broker has no 1.0)."""
    from ackmq.bench.workloads import AMQP_WORKLOADS
    names = ["amqp10-send-outcome", "amqp10-send-stream", "amqp10-receive"]
    assert not set(names) & set(AMQP_WORKLOADS)
    out_json = tmp_path / "a10.json"
    status = cli.main([*names, "--url", broker_url, "--messages", "100", "--rounds", "1",
                       "--json", str(out_json)])
    data = json.loads(out_json.read_text())
    assert status == 0, [r["error"] for r in data["runs"]]
    assert {m["name"] for r in data["runs"] for m in r["metrics"]} == set(names)
    assert all(r["extra"].get("queued", 100) == 100 for r in data["runs"])
