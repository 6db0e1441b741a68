"""The soak of docs/robustness.md in 21 seconds: mixed AMQP and STOMP load (confirm-each
and async publishers, consumers acking, requeueing, dead-lettering, no-ack with TTL
expiry, 100 churned connections) with kill -9 and restart of the broker every 8 s.
Nothing confirmed or receipted may be lost, no traceback in the broker's log.
ACKMQ_SOAK_MINUTES / ACKMQ_SOAK_KILL_EVERY (seconds) run it longer by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tools.robustness import soak

# CI-sized: two kills in 21 s; docs/robustness.md has the long settings
MINUTES = os.environ.get("ACKMQ_SOAK_MINUTES", "0.35")
KILL_EVERY = os.environ.get("ACKMQ_SOAK_KILL_EVERY", "8")

pytestmark = pytest.mark.skipif(bool(os.environ.get("ACKMQ_TEST_URL")),
                                reason="needs a broker of its own to kill")


@pytest.mark.slow
def test_B_soak_one_minute_with_kills_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    rc = soak.main(["--minutes", MINUTES, "--kill-every", KILL_EVERY, "--progress-every", "30",
                    "--work-dir", str(tmp_path / "work"), "--json", str(out),
                    "--plot", str(tmp_path / "soak.png")])
    r = json.loads(out.read_text())
    assert r["kills"] >= 2 and r["confirmed_amqp"] > 100 and r["receipted_stomp"] > 10
    assert r["lost"] == 0, r["lost_first"]
    assert r["log_trouble"] == [] and r["broker_alive_at_end"]
    assert r["requeued"] > 0 and r["dead_lettered"] > 0 and r["churn_cycles"] > 100
    assert rc == 0 and (tmp_path / "soak.png").stat().st_size > 0
