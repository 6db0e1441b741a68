"""`ackmq ctl await_startup` / `await_online_nodes` (SPEC M4, issue 28): a script that
starts `ackmq serve` in the background and calls ctl at once succeeds when it awaits
startup first. rabbitmqctl 3.10's answers (observed on the reference node) are written
down here: `await_online_nodes 1` prints "Will wait for at least 1 nodes to join the
cluster of rabbit@vm. Timeout: 300 seconds." and exits 0; a count it cannot reach
exits 70 after its timeout with "Error: timed out while waiting. Not enough nodes
joined rabbit@vm's cluster."; a count that is not a positive integer exits 65."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from test_mgmt_ctl import ctl


def _serve(data: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ackmq", "serve", "--port", "0", "--no-stomp", "--http-port",
         "0", "--data-dir", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_M4_await_startup_then_the_next_verb_succeeds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = _serve(data)
    try:
        # at once: the data dir, let alone ctl.sock, may not exist yet
        r = ctl("--data-dir", str(data), "await_startup", "--timeout", "120")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert (data / "ctl.sock").exists()
        r = ctl("--data-dir", str(data), "list_queues", "name")
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = ctl("--data-dir", str(data), "await_online_nodes", "1", "-t", "120")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert r.stdout.startswith("Will wait for at least 1 nodes to join the cluster of "
                                   "ackmq@") and r.stdout.endswith("Timeout: 120 seconds.\n")
        r = ctl("--data-dir", str(data), "-q", "await_online_nodes", "2", "-t", "0.5")
        assert r.returncode == 70 and r.stdout == ""
        assert "Error: timed out while waiting. Not enough nodes joined ackmq@" in r.stderr
    finally:
        broker.terminate()
        broker.wait(30)


def test_M4_await_startup_times_out_without_a_broker(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = ctl("--data-dir", str(tmp_path), "await_startup", "--timeout", "0.5")
    assert r.returncode == 70, (r.stdout, r.stderr)
    assert "timed out after 0.5 seconds waiting for the broker to start" in r.stderr
    assert time.monotonic() - t0 < 60
    stale = tmp_path / "ctl.sock"  # a previous run's socket file: nobody listens
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    assert ctl("--data-dir", str(tmp_path), "await_startup", "-t", "0.3").returncode == 70


def test_M4_await_online_nodes_refuses_a_bad_count(tmp_path: Path) -> None:
    for bad in ("0", "x", "-1"):
        r = ctl("--data-dir", str(tmp_path), "await_online_nodes", bad, "-t", "0")
        assert r.returncode == 65, (bad, r.stderr)
        assert "Bad argument: Argument must be a positive integer" in r.stderr
