"""Power loss on a real file system that drops unsynced writes: `ackmq serve` on LazyFS,
kill -9 + clear-cache under confirm-each publishers (tools/robustness/powerloss.py; MQTT:
powerloss_mqtt.py, the stream protocol: powerloss_stream.py; the
100-cycle runs are in docs/robustness.md). Skipped where LazyFS cannot be built."""

from __future__ import annotations

import pytest

# bounded: each cycle ends with a kill -9 and a restart; a torn cycle also remounts
# LazyFS (~20-40 s a cycle on a loaded 2-core machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lazyfs() -> None:
    from tools.robustness.powerloss import lazyfs_unavailable
    why = lazyfs_unavailable()
    if why:
        pytest.skip(why)


def test_P9_lazyfs_work_folders_never_hold_what_lazyfs_takes_for_an_option() -> None:
    """LazyFS drops a --config-path containing "-o" (any case) and aborts on
    config/default.toml: a work folder named "ackmq-powerloss-" + mkdtemp's random part
    failed every mount whenever that part began with "o" (CI, 1 in 37 runs)."""
    import shutil
    from pathlib import Path

    from tools.robustness.powerloss import LazyFS, lazyfs_workdir
    with pytest.raises(ValueError, match="contains '-o'"):
        LazyFS(Path("/var/tmp/ackmq-powerloss-Oq1x"))
    made = [lazyfs_workdir(kind) for kind in ("powerloss", "powerloss_mqtt",
                                              "powerloss_stream") for _ in range(40)]
    try:
        assert not [w for w in made if "-o" in str(w).lower()]
        for w in made:
            LazyFS(w)
    finally:
        for w in made:
            shutil.rmtree(w, ignore_errors=True)


def test_P9_lazyfs_power_cuts_lose_nothing_confirmed(lazyfs: None) -> None:
    from tools.robustness.powerloss import run
    rep = run(cycles=6, seed=7)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 6
    assert rep.confirmed > 0
    assert rep.lost == 0, rep.lines
    assert rep.tracebacks == []


def test_P9_lazyfs_no_fsync_loses_messages_but_always_comes_back(lazyfs: None) -> None:
    """--no-fsync: confirmed messages are lost at a power cut (LazyFS shows it), but the
    broker's metadata is synced, so it starts again every time (issue 23)."""
    from tools.robustness.powerloss import run
    rep = run(cycles=6, fsync=False, seed=7)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 6
    assert rep.lost > 0, rep.lines  # the run can see what --no-fsync gives up
    assert rep.tracebacks == []


def test_P9_lazyfs_torn_write_loses_nothing_confirmed(lazyfs: None) -> None:
    """LazyFS's torn-op fault: the next write to the active segment is split in three,
    parts 1 and 3 persisted, LazyFS dies (all else unsynced is gone): the torn frame is
    cut at recovery, nothing confirmed is lost, the broker starts."""
    from tools.robustness.powerloss import run
    rep = run(cycles=3, seed=11, torn=True, stop_untorn=True)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 3 or rep.tears < rep.cycles
    assert rep.confirmed > 0
    assert rep.lost == 0, rep.lines
    assert rep.tracebacks == []
    if rep.tears == 0:  # the cycles above were plain power cuts then, still checked
        pytest.skip("LazyFS did not take its torn-op fault in any cycle (seen on loaded "
                    "machines: 'no write to tear within 10 s'); torn writes are covered "
                    "by the in-process simulator (tests/test_store_crashsim.py): "
                    + "; ".join(rep.lines))


def test_L2_lazyfs_power_cuts_with_delayed_messages_pending(lazyfs: None) -> None:
    """Confirm-each publishers through a durable x-delayed-message exchange (x-delay up
    to 3 s), kill -9 + clear-cache while messages are pending and firing: after each
    restart every confirmed delayed message arrives once, none before its due time."""
    from tools.robustness.powerloss import run
    rep = run(cycles=3, seed=5, delayed_ms=3000)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 3
    assert rep.confirmed > 0
    assert (rep.lost, rep.duplicates, rep.early) == (0, 0, 0), rep.lines
    assert rep.tracebacks == []


def test_N3_N4_N5_lazyfs_power_cuts_keep_mqtt_state(lazyfs: None) -> None:
    """paho QoS 1 and QoS 2 publishers, a persistent session subscribed and a retained
    message PUBACKed before each kill -9 + clear-cache: every PUBACKed message and every
    QoS 2 message (its publisher resuming its session) is in the session after the cut,
    the session is present and still routes, every retained message is sent, and no
    QoS 2 message comes twice by the broker's doing: its id is written in its frame in
    the store (docs/mqtt.md, "QoS 2 across a power cut"). A copy the client made itself
    (paho-mqtt sending a PUBLISH again after the cut whose PUBREL it had already sent,
    read from its log) is counted apart."""
    from tools.robustness.powerloss_mqtt import run
    rep = run(cycles=3, seed=7)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 3
    assert rep.confirmed > 0
    assert (rep.lost, rep.duplicates, rep.qos2_twice) == (0, 0, 0), rep.lines
    assert (rep.sessions_lost, rep.retained_lost, rep.unfinished_qos2) == (0, 0, 0), rep.lines
    assert rep.tracebacks == []


def test_X3_X4_lazyfs_power_cuts_keep_publisher_sequences_and_offsets(lazyfs: None) -> None:
    """A named rstream Producer confirming each message, an offset stored every 50 and
    followed by a confirmed publish, kill -9 + clear-cache: every confirmed message is in
    the stream, the publisher sequence covers them (a resend of the last 30 and of the
    unconfirmed ones adds each id once, an unconfirmed one too: the sequence is kept in
    the records it covers), the stored offset is still there."""
    from tools.robustness.powerloss_stream import run
    rep = run(cycles=3, seed=7)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 3
    assert rep.confirmed > 0
    assert (rep.lost, rep.duplicates, rep.unconfirmed_twice, rep.sequence_low,
            rep.offsets_lost) == (0, 0, 0, 0, 0), rep.lines
    assert rep.tracebacks == []
