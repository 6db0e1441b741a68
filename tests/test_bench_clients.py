"""`ackmq bench`'s client workloads (J10 strategies by client, consume per ack mode,
the J8 window) run at a tiny scale and report sane figures; the low-level channel the
bench's drivers use (ackmq.client.lowlevel) works and fails as the broker says."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from ackmq.bench import cli
from ackmq.bench.clients import _no_ext_prefetch
from ackmq.client import ChannelClosed
from ackmq.client.lowlevel import open_connection
from ackmq.client.options import extended_prefetch


def _run(broker_url: str, tmp_path: Path, workloads: list[str], n: int,
         plot: bool = False) -> tuple[dict[str, Any], dict[str, float], str]:
    out = tmp_path / "b.json"
    args = [*workloads, "--url", broker_url, "--messages", str(n), "--rounds", "1",
            "--json", str(out)]
    if plot:
        args += ["--plot", str(tmp_path / "b.png")]
    status = cli.main(args)
    data = json.loads(out.read_text())
    failed = [(r["workload"], r["error"]) for r in data["runs"] if not r["ok"]]
    assert status == 0, failed
    values = {m["name"]: m["value"] for r in data["runs"] for m in r["metrics"]}
    table = "\n".join(f"{k} {v}" for k, v in values.items())
    return data, values, table


@pytest.mark.timeout(240)
def test_J10_client_publish_compares_clients_and_the_floor(
        broker_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, v, table = _run(broker_url, tmp_path, ["client-publish"], 40, plot=True)
    printed = capsys.readouterr().out
    for strategy, clients in (("each", ("ackmq", "pika", "aio-pika")),
                              ("batch", ("ackmq", "pika", "aio-pika")),
                              ("async", ("ackmq", "ackmq-aio", "pika", "aio-pika"))):
        for client in clients:
            assert v[f"{strategy}/{client}"] > 0, table
            assert v[f"cpu {strategy}/{client}"] > 0, table
        assert v[f"{strategy} ackmq÷pika"] == pytest.approx(
            v[f"{strategy}/ackmq"] / v[f"{strategy}/pika"]), table
    assert v["each/floor"] > 0
    assert v["each ackmq÷floor"] == pytest.approx(v["each/ackmq"] / v["each/floor"])
    assert v["each pika÷floor"] == pytest.approx(v["each/pika"] / v["each/floor"])
    (run,) = data["runs"]
    assert run["extra"]["n_each"] == 40 and run["extra"]["fdatasync_us"] > 0
    assert "== client-publish" in printed and "async ackmq÷pika" in printed
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run["deleted"] and all(q.startswith("ackmq-bench.client-publish.")
                                  for q in run["deleted"])


@pytest.mark.timeout(240)
def test_J1_J3_client_consume_every_ack_mode_with_optimize_off_and_on(
        broker_url: str, tmp_path: Path) -> None:
    data, v, table = _run(broker_url, tmp_path, ["client-consume"], 60)
    for mode in ("auto", "client", "dups_ok", "individual", "transacted"):
        assert v[mode] > 0 and v[f"{mode}+optack"] > 0, table
    assert v["auto optack on÷off"] == pytest.approx(v["auto+optack"] / v["auto"])
    (run,) = data["runs"]
    assert len(run["deleted"]) == 10  # one pre-filled queue per variant, all drained


def test_J8_windows_compared() -> None:
    """The no-extension baseline asks for the prefetch whose J8 window is P."""
    assert extended_prefetch(_no_ext_prefetch(12)) == 12
    assert extended_prefetch(12) == 18
    assert extended_prefetch(_no_ext_prefetch(100)) == 101  # the closest there is


@pytest.mark.timeout(240)
def test_J8_client_prefetch_ext_runs(broker_url: str, tmp_path: Path) -> None:
    _, v, table = _run(broker_url, tmp_path, ["client-prefetch-ext"], 60)
    for p, wide, narrow in ((12, 18, 12), (100, 150, 101)):
        assert v[f"P={p} window {wide}"] > 0 and v[f"P={p} window {narrow}"] > 0, table
        assert v[f"P={p} 1.5p÷p"] == pytest.approx(
            v[f"P={p} window {wide}"] / v[f"P={p} window {narrow}"])


# --- the low-level channel (bench drivers) ----------------------------------------------


def test_lowlevel_confirms_deliveries_and_broker_errors(broker_url: str) -> None:
    async def go() -> None:
        conn = await open_connection(broker_url, "ackmq-test-lowlevel")
        try:
            ch = await conn.channel()
            q = "ackmq-test.lowlevel"
            await ch.declare_queue(q)
            await ch.call(commands.Queue.Purge(queue=q))
            await ch.confirm_select()
            confirms: list[tuple[int, bool, bool]] = []
            ch.on_confirm = lambda tag, multiple, ack: confirms.append((tag, multiple, ack))
            one = ch.publish_bytes("", q, b"hello", 2)
            conn.write(one * 50)
            for _ in range(200):
                if confirms and confirms[-1][0] == 50:
                    break
                await asyncio.sleep(0.01)
            assert confirms and confirms[-1][0] == 50 and all(c[2] for c in confirms)
            assert await ch.queue_count(q) == 50
            got: list[tuple[int, bool, bytes]] = []
            done = asyncio.get_running_loop().create_future()

            def on_deliver(tag: int, redelivered: bool, body: bytes) -> None:
                got.append((tag, redelivered, body))
                if len(got) == 50:
                    conn.queue(ch.ack_bytes(tag, True))
                    done.set_result(None)

            ch.on_deliver = on_deliver
            await ch.qos(100)
            tag = await ch.consume(q)
            await asyncio.wait_for(done, 10)
            assert [g[0] for g in got] == list(range(1, 51))
            assert all(g[2] == b"hello" and not g[1] for g in got)
            await ch.cancel(tag)
            assert await ch.queue_count(q) == 0
            await ch.call(commands.Queue.Delete(queue=q))
            other = await conn.channel()
            with pytest.raises(ChannelClosed) as info:
                await other.queue_count("ackmq-test.no-such-queue")
            assert info.value.code == 404 and "no-such-queue" in str(info.value)
            assert conn.is_open  # only that channel closed
        finally:
            await conn.close()

    asyncio.run(go())
